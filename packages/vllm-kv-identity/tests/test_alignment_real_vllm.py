"""Against an installed vLLM (the integration sessions; skipped without one)."""

from __future__ import annotations

import pytest
from vllm_kv_identity import aligned_external_hit_tokens, mamba_alignment_tokens

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")


def test_alignment_with_real_kv_cache_classes() -> None:
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    mamba = kvi.MambaSpec(
        block_size=528, shapes=((4, 4),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )
    attention = kvi.FullAttentionSpec(
        block_size=528, num_kv_heads=2, head_size=64, dtype=torch.float16
    )
    config = kvi.KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[
            kvi.KVCacheGroupSpec(["attn"], attention),
            kvi.KVCacheGroupSpec(["mamba"], mamba),
        ],
    )
    assert mamba_alignment_tokens(config) == 528
    assert aligned_external_hit_tokens(2000, 528, config) == 1584
    pure = kvi.KVCacheConfig(
        num_blocks=10, kv_cache_tensors=[], kv_cache_groups=[kvi.KVCacheGroupSpec(["a"], attention)]
    )
    assert mamba_alignment_tokens(pure) is None
