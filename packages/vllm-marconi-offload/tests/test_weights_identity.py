"""L2 outlives the engine: blocks computed with other weights under the same model name
must never be found after a restart, with or without `pool_name`, `revision` unset."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kvpool_mmap import TieredStore
from test_pool import fake_vllm_config, layout
from vllm_marconi_offload.config import OffloadConfig
from vllm_marconi_offload.pool import build_store_config

KEYS = [b"k0", b"k1"]
HUB_ID = "org/tiny-model"


def hub_snapshot(cache: Path, commit: str) -> None:
    """What `huggingface_hub` leaves after downloading `HUB_ID` at `commit` (main)."""
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def local_checkpoint(folder: Path, payload: bytes) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 64}')
    shard = folder / "model.safetensors"
    shard.write_bytes(payload)
    stat = shard.stat()  # a later save: coarse file-system clocks must not hide it
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def engine_finds_blocks(tmp_path: Path, model: str, extra: dict[str, str]) -> int:
    """Start an engine's store, count the blocks of `KEYS` it finds, store them, stop."""
    config = OffloadConfig.from_extra_config(
        {
            "cpu_pool_path": str(tmp_path / "l1"),
            "cpu_bytes_to_use": 8 * 8192,
            "l2_pool_path": str(tmp_path / "l2"),
            "l2_bytes_to_use": 1 << 20,
            **extra,
        }
    )
    store = TieredStore(build_store_config(fake_vllm_config(Path(model)), config, layout(), 32))
    try:
        found = len(store.lookup(KEYS))
        if not found:
            store.put(KEYS, np.ones((len(KEYS), store.config.stride), dtype=np.uint8))
        return found
    finally:
        store.close()  # flushes to L2


@pytest.mark.parametrize("pool_name", [None, "prod"])
@pytest.mark.parametrize("source", ["hub snapshot", "local folder"])
def test_new_weights_under_the_same_name_start_with_an_empty_l2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, pool_name: str | None
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = tmp_path / "model"
    weights: dict[str, tuple[str, Callable[[int], None]]] = {
        "hub snapshot": (HUB_ID, lambda n: hub_snapshot(tmp_path / "hub", f"{n}" * 40)),
        "local folder": (str(folder), lambda n: local_checkpoint(folder, bytes([n]) * 200_000)),
    }
    model, save_weights = weights[source]
    extra = {"pool_name": pool_name} if pool_name else {}

    save_weights(1)
    assert engine_finds_blocks(tmp_path, model, extra) == 0
    assert engine_finds_blocks(tmp_path, model, extra) == len(KEYS)  # a restart hits
    save_weights(2)  # new weights, same name
    assert engine_finds_blocks(tmp_path, model, extra) == 0
