"""Tensor-parallel ranks that arrange their KV caches differently stop the server at
startup, and the error says which rank differs from rank 0 and in which layer."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pool import fake_vllm_config, layout
from vllm_marconi_offload.config import OffloadConfig
from vllm_marconi_offload.layout import LayoutError
from vllm_marconi_offload.pool import (
    adopt_physical_layout,
    build_store_config,
    publish_physical_layout,
)

L0 = "l0:torch.bfloat16:1:(2, 32, 128):(8192, 256, 128, 1)"
NHD = L0 + "\nl1:torch.bfloat16:1:(2, 32, 128):(8192, 256, 128, 1)"
HND_L1 = L0 + "\nl1:torch.bfloat16:1:(2, 32, 128):(8192, 128, 4096, 1)"


def publish_ranks(tmp_path: Path, layouts: list[str]) -> object:
    """Every rank of a TP=len(layouts) engine publishes its layout into real files."""
    vllm_config = fake_vllm_config(tmp_path)
    vllm_config.parallel_config.tensor_parallel_size = len(layouts)
    config = OffloadConfig.from_extra_config({"cpu_pool_path": str(tmp_path / "l1")})
    base = build_store_config(vllm_config, config, layout(), 32)
    for rank, physical in enumerate(layouts):
        publish_physical_layout(base, rank, physical)
    return base


def test_the_error_names_the_differing_rank_and_layer(tmp_path: Path) -> None:
    base = publish_ranks(tmp_path, [NHD, NHD, HND_L1, NHD])
    with pytest.raises(LayoutError) as caught:
        adopt_physical_layout(base)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "rank 2 has 'l1:torch.bfloat16:1:(2, 32, 128):(8192, 128, 4096, 1)'" in message
    assert "where rank 0 has 'l1:torch.bfloat16:1:(2, 32, 128):(8192, 256, 128, 1)'" in message
    assert "rank 1" not in message  # ranks 1 and 3 agree with rank 0
    assert "rank 3" not in message
    assert str(tmp_path / "l1") in message


def test_a_rank_with_fewer_layers_is_named(tmp_path: Path) -> None:
    base = publish_ranks(tmp_path, [NHD, L0])
    with pytest.raises(LayoutError, match=r"rank 1 has 'nothing' where rank 0 has 'l1:"):
        adopt_physical_layout(base)  # type: ignore[arg-type]


def test_agreeing_ranks_share_one_fingerprint(tmp_path: Path) -> None:
    base = publish_ranks(tmp_path, [NHD, NHD])
    assert adopt_physical_layout(base) == publish_physical_layout(base, 0, NHD)  # type: ignore[arg-type]
