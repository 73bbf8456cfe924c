"""`MemKVOffloadingSpec` (direct mode) on real vLLM (CPU build) and a real `memkv serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_process import BLOCK, make_prompt
from memkv_harness import P1, P3, PROMPTS, direct_config
from memkv_server import MemKVServer
from vllm_env import EngineRun

pytestmark = pytest.mark.vllm  # real vLLM engines


def test_direct_spec_round_trips_within_and_across_processes(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": direct_config(),
        "phases": [
            {"prompts": PROMPTS},
            # vLLM's own prefix cache is emptied: every hit must come back from MemKV;
            # the pause lets the test wait until phase 1's last stores have landed
            {"reset_prefix_cache": True, "prompts": PROMPTS, "pause": True},
        ],
    }
    engine = start_engine(spec, **memkv.env())
    engine.wait_paused(1)
    memkv.wait_for_items(13)  # P1 (6 blocks), P2 (2 more), P3 (5): all stored
    engine.resume(1)
    first = engine.result()
    assert first.tokens(0) == memkv_baseline.tokens(0)
    assert first.tokens(1) == memkv_baseline.tokens(0)
    assert first.cached(1)[0] == 6 * BLOCK, first.cached(1)
    assert first.cached(1)[2] == 5 * BLOCK, first.cached(1)

    second = start_engine({**spec, "phases": spec["phases"][:1]}, **memkv.env()).result()
    assert second.tokens(0) == memkv_baseline.tokens(0)
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)


@pytest.mark.newest
def test_engines_share_a_prompt_only_under_the_same_cache_salt(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str
) -> None:
    """Engine A stores P1 under one tenant's salt; engine B finds none of it under another
    salt and all of it under the same one: salted blocks are never shared across tenants."""
    first = {"model": tiny_llama, "kv_transfer_config": direct_config()}
    start_engine({**first, "phases": [{"prompts": [P1], "cache_salts": ["tenant-a"]}]},
                 **memkv.env()).result()  # fmt: skip
    memkv.wait_for_items(6)  # P1's six full blocks
    phases = [
        {"prompts": [P1], "cache_salts": ["tenant-b"]},
        {"reset_prefix_cache": True, "prompts": [P1], "cache_salts": ["tenant-a"]},
    ]
    second = start_engine({**first, "phases": phases}, **memkv.env()).result()
    assert second.cached(0)[0] == 0, second.cached(0)
    assert second.cached(1)[0] == 6 * BLOCK, second.cached(1)


def _vanishing_phases(between: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """P1 stored; P1 loaded back (the lookup's HIT stays cached); `between`; P1 again,
    whose cached HIT is stale by then: its load finds nothing in MemKV."""
    return [
        {"prompts": [P1]},
        {"reset_prefix_cache": True, "prompts": [P1]},
        *between,
        {"reset_prefix_cache": True, "prompts": [P1]},
    ]


def test_direct_server_restart_between_lookup_and_load_recomputes(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        # a lookup answer of 'present' is reused for 300 s: the restart cannot be noticed
        # before the load
        "kv_transfer_config": direct_config(memkv_lookup_hit_ttl_s=300),
        "phases": _vanishing_phases([]),
    }
    spec["phases"][-1]["pause"] = True
    engine = start_engine(spec, **memkv.env())
    engine.wait_paused(2)
    memkv.restart()
    engine.resume(2)
    run = engine.result()
    assert run.cached(1) == [6 * BLOCK], run.cached(1)  # loaded from MemKV
    assert run.tokens(2) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(2) == [0], run.cached(2)  # recomputed
    assert "6 of 6 blocks not loaded; vLLM recomputes them" in run.log


def _evicting_run(
    start_engine: Any, tiny_llama: str, tmp_path: Path, exists_lease_ms: int | None
) -> tuple[EngineRun, int, int]:
    """P1 looked up and loaded, then P3 and a filler stored into one lane of 512 KiB
    (~16 blocks of 32 KiB): LRU alone evicts P1's blocks; then P1 again."""
    memkv = MemKVServer(
        tmp_path / "small.log", memory="512KiB", lanes=1, exists_lease_ms=exists_lease_ms
    ).start()
    try:
        spec = {
            "model": tiny_llama,
            "kv_transfer_config": direct_config(memkv_lookup_hit_ttl_s=300),
            "phases": _vanishing_phases(
                [{"reset_prefix_cache": True, "prompts": [P3, make_prompt(4, 12)]}]
            ),
        }
        run = start_engine(spec, **memkv.env()).result()
        totals = memkv.lane_totals("evictions", "lease_breaks")
    finally:
        memkv.stop()
    return run, totals["evictions"], totals["lease_breaks"]


def test_direct_value_evicted_between_lookup_and_load_recomputes(
    start_engine: Any, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    run, evictions, _ = _evicting_run(start_engine, tiny_llama, tmp_path, exists_lease_ms=0)
    assert evictions >= 6, evictions
    assert run.cached(1) == [6 * BLOCK], run.cached(1)
    assert run.tokens(3) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(3) == [0], run.cached(3)  # recomputed
    assert "blocks not loaded; vLLM recomputes them" in run.log


def test_direct_exists_lease_keeps_looked_up_values_until_the_load(
    start_engine: Any, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    # the server's default lease: P1's lookup shields its blocks; the others are evicted
    run, evictions, lease_breaks = _evicting_run(start_engine, tiny_llama, tmp_path, None)
    assert evictions >= 6, evictions
    assert lease_breaks == 0
    assert run.tokens(3) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(3) == [6 * BLOCK], run.cached(3)  # loaded from MemKV
    assert "blocks not loaded" not in run.log
