"""The aligned external-hit helper, on stand-ins shaped like vLLM's KVCacheConfig."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from vllm_kv_identity import aligned_external_hit_tokens, mamba_alignment_tokens


@dataclass
class KVCacheSpec:
    block_size: int


@dataclass
class FullAttentionSpec(KVCacheSpec):
    num_kv_heads: int = 8


@dataclass
class SlidingWindowSpec(KVCacheSpec):
    sliding_window: int = 128


@dataclass
class MambaSpec(KVCacheSpec):
    mamba_cache_mode: str = "align"


class GDNSpec(MambaSpec):
    """A model-specific subclass (recognised by its base's name)."""


@dataclass
class UniformTypeKVCacheSpecs(KVCacheSpec):
    kv_cache_specs: dict[str, KVCacheSpec] = field(default_factory=dict)


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[object]
    kv_cache_groups: list[KVCacheGroupSpec]


def config(*specs: KVCacheSpec) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layer{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=100, kv_cache_tensors=[], kv_cache_groups=groups)


HYBRID = config(FullAttentionSpec(528), MambaSpec(528))
ATTENTION = config(FullAttentionSpec(16), SlidingWindowSpec(16))


def test_alignment_of_each_kind_of_model() -> None:
    assert mamba_alignment_tokens(HYBRID) == 528
    assert mamba_alignment_tokens(ATTENTION) is None
    assert mamba_alignment_tokens(config(FullAttentionSpec(64), GDNSpec(64))) == 64
    assert mamba_alignment_tokens(config(MambaSpec(64), MambaSpec(96))) == 192  # lcm
    nested = UniformTypeKVCacheSpecs(32, {"a": FullAttentionSpec(32), "m": MambaSpec(48)})
    assert mamba_alignment_tokens(config(nested)) == 48
    assert mamba_alignment_tokens(object()) is None


def test_mamba_recognised_by_its_cache_mode_attribute() -> None:
    class Renamed:
        block_size = 32
        mamba_cache_mode = "all"

    assert mamba_alignment_tokens(config(Renamed())) == 32  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -16, None, 16.0, True])
def test_bad_mamba_block_size(bad: object) -> None:
    with pytest.raises(ValueError, match="block_size"):
        mamba_alignment_tokens(config(MambaSpec(bad)))  # type: ignore[arg-type]


def test_hybrid_hits_end_on_a_mamba_block_boundary() -> None:
    assert aligned_external_hit_tokens(2000, 528, HYBRID) == 1584  # ends at 2112
    assert aligned_external_hit_tokens(527, 528, HYBRID) == 0
    assert aligned_external_hit_tokens(528, 528, HYBRID) == 528
    assert aligned_external_hit_tokens(1000, 0, HYBRID) == 528
    assert aligned_external_hit_tokens(0, 528, HYBRID) == 0


def test_hit_never_covers_the_last_token() -> None:
    # a 1056-token prompt fully cached: the last token must be computed, and the
    # state before it is only cached at 528
    assert aligned_external_hit_tokens(1056, 0, HYBRID, num_tokens=1056) == 528
    assert aligned_external_hit_tokens(1056, 0, ATTENTION, num_tokens=1056) == 1055
    assert aligned_external_hit_tokens(10, 0, ATTENTION, num_tokens=1) == 0


def test_attention_models_keep_their_hit() -> None:
    assert aligned_external_hit_tokens(37, 16, ATTENTION) == 37


def test_unaligned_start_gives_no_hit_before_the_next_boundary() -> None:
    # local tokens that are not on a Mamba boundary: the hit must reach the next one
    assert aligned_external_hit_tokens(500, 100, HYBRID) == 428
    assert aligned_external_hit_tokens(400, 100, HYBRID) == 0


def test_negative_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_hit_tokens"):
        aligned_external_hit_tokens(-1, 0, HYBRID)
    with pytest.raises(ValueError, match="num_computed_tokens"):
        aligned_external_hit_tokens(1, -1, HYBRID)


def test_result_is_the_longest_safe_prefix_exhaustively() -> None:
    cfg = config(FullAttentionSpec(8), MambaSpec(8), MambaSpec(12))  # alignment 24
    for computed in range(0, 60, 3):
        for hit in range(0, 80, 5):
            for num_tokens in (None, computed + hit, computed + hit + 1, 50):
                got = aligned_external_hit_tokens(hit, computed, cfg, num_tokens=num_tokens)
                safe = [
                    h
                    for h in range(hit + 1)
                    if (computed + h) % 24 == 0
                    and (num_tokens is None or computed + h <= num_tokens - 1)
                ]
                assert got == max(safe, default=0), (computed, hit, num_tokens)
