"""Both modes on real vLLM (CPU build) over a real Mooncake Store cluster on 127.0.0.1:
`mooncake_master` with its embedded HTTP metadata server and three store processes that
mount the memory; the vLLM engines are pure clients (`mooncake_segment_mb` 0)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_process import BLOCK, make_prompt
from memkv_harness import (
    P1,
    P3,
    PROMPTS,
    STALL_NAMES,
    check_one_budget_per_stop,
    check_stalls,
    direct_config,
    engine_env,
    one_stop_phases,
    run_stall_engine,
    stall_phases,
    tier_config,
)
from mooncake_cluster import MooncakeCluster
from vllm_env import EngineRun

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None,
    reason="Mooncake Store is not installed (pip install 'memkv-vllm[mooncake]')",
)
FILLER = make_prompt(4, 12)
SHARING_BUDGET_S = 10.0  # stall_budget_s of the tests that check sharing, not stalls


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MooncakeCluster]:
    c = MooncakeCluster(tmp_path, stores=3, segment_mb=16).start()
    yield c
    c.stop()


def test_mooncake_tier_shares_blocks_across_instances(
    start_engine: Any, cluster: MooncakeCluster, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    # Sharing, not stalls, is under test: on a busy 2-core runner a loopback put or lookup
    # can miss the 1 s default budget and be dropped or read as a miss (stall tests below).
    config = tier_config(stall_budget_s=SHARING_BUDGET_S)
    spec = {"model": tiny_llama, "kv_transfer_config": config, "phases": [{"prompts": PROMPTS}]}
    first = start_engine(spec, **cluster.env()).result()
    assert first.tokens(0) == memkv_baseline.tokens(0)
    assert "tier ready" in first.log
    assert "Mooncake Store (master" in first.log
    second = start_engine(spec, **cluster.env()).result()  # another process, fresh CPU pool
    assert second.tokens(0) == memkv_baseline.tokens(0)
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)
    missed = [line for line in (first.log + second.log).splitlines() if "timed out" in line]
    assert second.cached(0)[2] == 5 * BLOCK, (second.cached(0), missed[:4])


def test_mooncake_tier_survives_a_store_process_kill_and_a_master_restart(
    start_engine: Any, cluster: MooncakeCluster, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    fresh = make_prompt(5, 4)
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": tier_config(),
        "phases": [
            {"prompts": [P1, P3, FILLER]},  # 23 chunks spread over the three segments
            # store process 0 is SIGKILLed: the tier still remembers every chunk as present
            {"pause": True, "reset_connector": True, "prompts": [P1, P3, FILLER]},
            # the master is restarted: it forgot every object
            {"pause": True, "reset_connector": True, "prompts": [P1]},
            # the segments have re-mounted: new chunks are stored and loaded again
            {"pause": True, "prompts": [fresh]},
            {"reset_connector": True, "prompts": [fresh]},
        ],
    }
    engine = start_engine(spec, **cluster.env())
    engine.wait_paused(1)
    cluster.kill_store(0)
    engine.resume(1)
    engine.wait_paused(2)
    cluster.restart_master()
    engine.resume(2)
    engine.wait_paused(3)
    time.sleep(cluster.client_ttl_s + 3)  # the surviving store processes re-mount
    engine.resume(3)
    run = engine.result()
    full = [memkv_baseline.tokens(0)[0], memkv_baseline.tokens(0)[2]]
    assert run.tokens(1)[:2] == full  # identical tokens after the kill
    assert sum(run.cached(1)) < 6 * BLOCK + 5 * BLOCK + 12 * BLOCK, run.cached(1)
    # the dead segment's chunks were recomputed: found missing, or (Mooncake taking longer
    # than the stall budget to give up on the dead peer) timed out
    assert "could not be loaded" in run.log or "timed out or is down" in run.log
    assert run.tokens(2) == full[:1]  # identical tokens after the master restart
    assert run.cached(2) == [0], run.cached(2)
    assert run.cached(4) == [4 * BLOCK], run.cached(4)  # stored and loaded after it
    assert run.tokens(4) == run.tokens(3)


def test_mooncake_direct_round_trips_across_processes(
    start_engine: Any, cluster: MooncakeCluster, tiny_llama: str, memkv_baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": direct_config(),
        "phases": [{"prompts": PROMPTS}, {"reset_prefix_cache": True, "prompts": PROMPTS}],
    }
    first = start_engine(spec, **cluster.env()).result()
    assert first.tokens(1) == memkv_baseline.tokens(0)
    assert first.cached(1)[0] == 6 * BLOCK, first.cached(1)
    second = start_engine({**spec, "phases": spec["phases"][:1]}, **cluster.env()).result()
    assert second.tokens(0) == memkv_baseline.tokens(0)
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)


def test_mooncake_direct_lease_expired_value_removed_before_the_load_recomputes(
    start_engine: Any, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    # P1's lookup leases its blocks for 500 ms; once that ran out, removing every unleased
    # value (what eviction may take) empties Mooncake while the engine, whose lookup answer
    # stays cached for 300 s, still believes P1's blocks are there
    cluster = MooncakeCluster(tmp_path, stores=3, segment_mb=16, lease_ms=500).start()
    try:
        spec = {
            "model": tiny_llama,
            "kv_transfer_config": direct_config(memkv_lookup_hit_ttl_s=300),
            "phases": [
                {"prompts": [P1]},
                {"reset_prefix_cache": True, "prompts": [P1]},
                {"pause": True, "reset_prefix_cache": True, "prompts": [P1]},
            ],
        }
        engine = start_engine(spec, **cluster.env())
        engine.wait_paused(2)
        time.sleep(1)  # the lease has run out
        removed = cluster.remove_unleased()
        engine.resume(2)
        run = engine.result()
    finally:
        cluster.stop()
    assert removed >= 6, removed
    assert run.cached(1) == [6 * BLOCK], run.cached(1)  # loaded from Mooncake
    assert run.tokens(2) == [memkv_baseline.tokens(0)[0]]
    assert run.cached(2) == [0], run.cached(2)  # gone: recomputed
    assert "blocks not loaded; vLLM recomputes them" in run.log


@pytest.mark.newest
def test_mooncake_master_or_stores_stopped_never_stall_the_engine(
    tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    cluster = MooncakeCluster(tmp_path, stores=3, segment_mb=16, client_ttl_s=10).start()
    assert cluster.master is not None
    master, stores = cluster.master.pid, [p.pid for p in cluster.segments]
    spec = {"model": tiny_llama, "kv_transfer_config": direct_config(),
            "phases": stall_phases([master], stores, stores[0])}  # fmt: skip
    results, log = run_stall_engine(
        spec, tmp_path, engine_env(**cluster.env()), [master, *stores], cluster.stop
    )
    check_stalls([r for r in results if r["calls"]], memkv_baseline, STALL_NAMES)
    assert "timed out or is down" in log


@pytest.mark.newest
def test_mooncake_master_then_a_store_stopped_cost_one_budget_each(
    tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    # a client TTL longer than the test: the stopped store keeps its segment mounted
    cluster = MooncakeCluster(tmp_path, stores=3, segment_mb=16, client_ttl_s=120).start()
    assert cluster.master is not None
    master, store = cluster.master.pid, cluster.segments[0].pid
    spec = {"model": tiny_llama, "kv_transfer_config": direct_config(),
            "phases": one_stop_phases([master, store])}  # fmt: skip
    results, log = run_stall_engine(
        spec, tmp_path, engine_env(**cluster.env()), [master, store], cluster.stop
    )
    check_one_budget_per_stop(results, memkv_baseline)
    assert "register_buffer" not in log
