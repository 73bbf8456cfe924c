"""The store configuration every process derives, and the store it opens."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from kv_eviction import policy_names
from kvpool_mmap import TieredStore
from vllm_marconi_offload.config import OffloadConfig
from vllm_marconi_offload.layout import LayoutError, SlotLayout
from vllm_marconi_offload.pool import (
    adopt_physical_layout,
    build_store_config,
    engine_name,
    layout_fingerprint,
    physical_layout_file,
    publish_physical_layout,
)


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


@pytest.mark.parametrize("policy", policy_names())
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


@pytest.mark.parametrize("overflow", [None, "demote"])
def test_l1_overflow_reaches_the_store(tmp_path: Path, overflow: str | None) -> None:
    extra = {} if overflow is None else {"l1_overflow": overflow}
    config = OffloadConfig.from_extra_config(extra)
    store_config = build_store_config(fake_vllm_config(tmp_path), config, layout(), 32)
    assert store_config.l1_overflow == (overflow or "demote")


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
    named = OffloadConfig.from_extra_config({"pool_name": "prod.llama-8b"})
    assert engine_name(vllm_config, named, before) == "prod.llama-8b"  # used as it is


def test_l2_written_under_another_physical_layout_is_never_loaded(tmp_path: Path) -> None:
    """The workers publish how their KV bytes are arranged; the scheduler adopts it, and a
    restart under another arrangement (another attention backend) starts with an empty
    L2 instead of loading blocks whose bytes mean something else."""
    config = OffloadConfig.from_extra_config(
        {
            "cpu_pool_path": str(tmp_path / "l1"),
            "cpu_bytes_to_use": 64 * 8192,
            "l2_pool_path": str(tmp_path / "l2"),
            "l2_bytes_to_use": 1 << 20,
        }
    )
    base = build_store_config(fake_vllm_config(tmp_path), config, layout(), 32)

    def run_engine(physical: str) -> TieredStore:
        worker_config = publish_physical_layout(base, 0, physical)
        TieredStore(worker_config).close(flush=False)  # the worker creates L1 ...
        scheduler_config = adopt_physical_layout(base)  # ... the scheduler adopts it
        assert scheduler_config == worker_config
        return TieredStore(scheduler_config)

    store = run_engine("l0:torch.bfloat16:1:(4, 32, 128):(16384, 4096, 128, 1)")
    store.put([b"k0", b"k1"], np.ones((2, 2 * 4096), dtype=np.uint8))
    store.close()  # flushes to L2
    same = run_engine("l0:torch.bfloat16:1:(4, 32, 128):(16384, 4096, 128, 1)")
    assert len(same.lookup([b"k0", b"k1"])) == 2
    same.close()
    other = run_engine("l0:torch.bfloat16:1:(4, 32, 128):(16384, 128, 4096, 1)")
    assert other.lookup([b"k0", b"k1"]) == []
    other.close()


def test_scheduler_refuses_missing_or_disagreeing_layouts(tmp_path: Path) -> None:
    config = OffloadConfig.from_extra_config({"cpu_pool_path": str(tmp_path / "l1")})
    vllm_config = fake_vllm_config(tmp_path)
    vllm_config.parallel_config.tensor_parallel_size = 2
    base = build_store_config(vllm_config, config, layout(), 32)
    publish_physical_layout(base, 0, "a")
    with pytest.raises(LayoutError, match="rank 1 published no KV layout"):
        adopt_physical_layout(base)
    publish_physical_layout(base, 1, "b")
    with pytest.raises(LayoutError, match="arrange their KV caches differently"):
        adopt_physical_layout(base)
    publish_physical_layout(base, 1, "a")
    assert adopt_physical_layout(base).fingerprint != base.fingerprint
    assert physical_layout_file(base, 1).read_text() == "a"
