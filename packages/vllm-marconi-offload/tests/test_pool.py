"""The store configuration every process derives, and the store it opens."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from kvpool_mmap import TieredStore
from vllm_marconi_offload.config import EVICTION_POLICIES, OffloadConfig
from vllm_marconi_offload.layout import SlotLayout
from vllm_marconi_offload.pool import build_store_config, engine_name, layout_fingerprint


def fake_vllm_config(model: Path) -> SimpleNamespace:
    """The handful of VllmConfig fields the pool reads (vLLM itself is not needed here)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(model=str(model), revision=None, dtype="bfloat16"),
        cache_config=SimpleNamespace(cache_dtype="auto"),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=1, data_parallel_size=1, data_parallel_rank=0
        ),
        kv_transfer_config=SimpleNamespace(engine_id="e1"),
    )


def layout() -> SlotLayout:
    spec = SimpleNamespace(page_size_bytes=4096, block_size=32, head_size=64)
    group = SimpleNamespace(layer_names=["l0", "l1"], kv_cache_spec=spec)
    return SlotLayout.from_kv_cache_config(SimpleNamespace(kv_cache_groups=[group], num_blocks=8))


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_every_eviction_policy_opens_a_store(tmp_path: Path, policy: str) -> None:
    config = OffloadConfig.from_extra_config(
        {
            "cpu_pool_path": str(tmp_path / "l1"),
            "cpu_bytes_to_use": 64 * 8192,
            "l2_pool_path": str(tmp_path / "l2"),
            "l2_bytes_to_use": 1 << 20,
            "eviction_policy": policy,
        }
    )
    store_config = build_store_config(fake_vllm_config(tmp_path), config, layout(), 32)
    assert store_config.stride == 2 * 4096
    store = TieredStore(store_config)
    try:
        ticket = store.begin_store([b"k0", b"k1"])
        assert all(slot is not None for slot in ticket.l1_slots)
        store.commit_store(ticket)
        assert len(store.lookup([b"k0", b"k1"])) == 2
    finally:
        store.close()


def test_pool_name_survives_restarts_and_tracks_the_checkpoint(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    vllm_config = fake_vllm_config(model)
    config = OffloadConfig.from_extra_config({})
    before = layout_fingerprint(vllm_config, layout(), 32)
    assert layout_fingerprint(vllm_config, layout(), 32) == before  # stable
    name = engine_name(vllm_config, config, before)
    assert name.startswith("model-")
    (model / "config.json").write_text('{"hidden_size": 128}')  # a new checkpoint
    assert layout_fingerprint(vllm_config, layout(), 32) != before
    named = OffloadConfig.from_extra_config({"pool_name": "prod/llama 8b"})
    assert engine_name(vllm_config, named, before) == "prod_llama_8b"
