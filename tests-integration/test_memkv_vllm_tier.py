"""The `memkv` secondary tier on real vLLM (CPU build) against a real `memkv serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_process import BLOCK, make_prompt
from memkv_harness import P1, P3, PROMPTS, tier_config
from memkv_server import MemKVServer
from vllm_env import EngineRun

pytestmark = pytest.mark.vllm  # real vLLM engines


def test_tier_keeps_tokens_and_shares_blocks_across_processes(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": tier_config(),
        "phases": [{"prompts": PROMPTS}],
    }
    first = start_engine(spec, **memkv.env()).result()
    assert first.tokens(0) == memkv_baseline.tokens(0)
    stored = memkv.lane_totals("hits", "misses", "items")
    # P1 (6 blocks), P2 (2 more), P3 (5): every full block of every prompt reached MemKV
    assert stored["items"] >= 13, stored

    # a second engine in another process (same PYTHONHASHSEED, fresh CPU pool)
    second = start_engine(spec, **memkv.env()).result()
    assert second.tokens(0) == memkv_baseline.tokens(0)
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)
    assert second.cached(0)[2] == 5 * BLOCK, second.cached(0)
    after = memkv.lane_totals("hits", "misses", "items")
    assert after["hits"] - stored["hits"] >= 11, (stored, after)  # loads served by MemKV


def test_tier_server_restart_between_lookup_and_load_recomputes(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": tier_config(),
        "phases": [
            {"prompts": [P1]},
            # the tier still remembers P1's chunks as present (they were just stored);
            # the server restart empties MemKV before the load runs
            {"pause": True, "reset_connector": True, "prompts": [P1]},
        ],
    }
    engine = start_engine(spec, **memkv.env())
    engine.wait_paused(1)
    memkv.restart()
    engine.resume(1)
    run = engine.result()
    assert run.tokens(0) == [memkv_baseline.tokens(0)[0]]
    assert run.tokens(1) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(1) == [0]  # recomputed
    assert "could not be loaded" in run.log


def test_tier_value_evicted_between_lookup_and_load_recomputes(
    start_engine: Any, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    # one lane of 512 KiB holds ~16 chunks of 32 KiB: later stores evict P1's chunks (LRU)
    memkv = MemKVServer(tmp_path / "small.log", memory="512KiB", lanes=1).start()
    try:
        filler = make_prompt(4, 12)
        spec = {
            "model": tiny_llama,
            "kv_transfer_config": tier_config(),
            "phases": [
                {"prompts": [P1]},
                {"reset_connector": True, "prompts": [P3, filler]},
                # the tier remembers P1's chunks as present; MemKV has evicted them
                {"reset_connector": True, "prompts": [P1]},
            ],
        }
        run = start_engine(spec, **memkv.env()).result()
        evictions = memkv.lane_totals("evictions")["evictions"]
    finally:
        memkv.stop()
    assert evictions >= 6, evictions
    assert run.tokens(2) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(2) == [0]  # recomputed
    assert "could not be loaded" in run.log
