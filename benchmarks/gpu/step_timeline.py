"""Where a multi-turn round's time goes: one line per scheduler step, and its report.

`install(path)` wraps vLLM's `Scheduler.schedule` and `Scheduler.update_from_output` (in
the process that calls it and in engine processes forked after it) so every step appends
one JSON line to `path`: `{"k": "s", ...}` when a step is scheduled (monotonic time, tokens
and requests scheduled, requests new to the batch, running, waiting) and `{"k": "u", ...}`
when its output comes back (loads and stores the connector reported finished). The clock
is `time.monotonic`, shared by every process of the host, so the benchmark's round
boundaries line up with the steps.

Each process that schedules also samples every thread's Python stack every 2 ms and
appends `{"k": "f", ...}` (thread, innermost frames first) whenever a thread's stack
changes, so a slow step shows what its threads were doing.

`python step_timeline.py TIMELINE ROUNDS_JSON` reports, per round: the steps, and the wall
time of the steps that computed nothing (waiting for loads), that carried prefill tokens,
and that only decoded; the mean decode batch; when the loads reported done. With
`--stalls MS` it lists instead each warm-round step slower than MS milliseconds and, per
thread of every sampled process (engine core, model workers), the stacks it spent that
step in, leaving out threads that only waited for work.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TextIO

from stack_sampler import describe

_ENV = "STEP_TIMELINE"
_SAMPLE_S = 0.002
_FRAMES = 10
_sink: TextIO | None = None
_sampled_pid = -1
# Innermost frames of threads that are only waiting for work.
_IDLE_FRAMES = ("threading.py:", "queue.py:", "selectors.py:", "poll.py:", "connection.py:wait")


def install_from_env() -> None:
    """`install($STEP_TIMELINE)` when that variable is set."""
    path = os.environ.get(_ENV)
    if path:
        install(path)


def install(path: str) -> None:
    """Record every scheduler step of this process and its forked children into `path`."""
    global _sink
    if _sink is not None:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    _sink = open(path, "a", buffering=1)  # noqa: SIM115 - one line per step, for the process' life
    schedule: Callable[..., Any] = Scheduler.schedule
    update: Callable[..., Any] = Scheduler.update_from_output

    def timed_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        _ensure_sampler()
        out = schedule(self, *args, **kwargs)
        _write(
            k="s",
            tokens=out.total_num_scheduled_tokens,
            reqs=len(out.num_scheduled_tokens),
            new=len(out.scheduled_new_reqs),
            running=len(self.running),
            waiting=len(self.waiting),
        )
        return out

    def timed_update(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        kv = getattr(model_runner_output, "kv_connector_output", None)
        _write(
            k="u",
            loaded=len(getattr(kv, "finished_recving", None) or ()),
            stored=len(getattr(kv, "finished_sending", None) or ()),
        )
        return update(self, scheduler_output, model_runner_output)

    Scheduler.schedule = timed_schedule  # type: ignore[method-assign]
    Scheduler.update_from_output = timed_update  # type: ignore[method-assign]
    _sample_model_runner()
    _ensure_sampler()


def _sample_model_runner() -> None:
    """Sample the stacks of a worker process too (where the executor runs the model in a
    process of its own)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    execute: Callable[..., Any] = GPUModelRunner.execute_model

    def sampled_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        _ensure_sampler()
        return execute(self, *args, **kwargs)

    GPUModelRunner.execute_model = sampled_execute  # type: ignore[method-assign]


def _ensure_sampler() -> None:
    """One stack sampler per process (threads do not survive a fork)."""
    global _sampled_pid
    if _sampled_pid != os.getpid():
        _sampled_pid = os.getpid()
        threading.Thread(target=_sample_stacks, name="step-timeline", daemon=True).start()


def _write(**fields: Any) -> None:
    assert _sink is not None
    _sink.write(json.dumps({"t": round(time.monotonic(), 6), "pid": os.getpid(), **fields}) + "\n")


def _sample_stacks() -> None:
    """Write a thread's stack whenever it differs from its previous sample."""
    me = threading.get_ident()
    last: dict[int, str] = {}
    while True:
        time.sleep(_SAMPLE_S)
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack = describe(frame, _FRAMES)
            if last.get(ident) != stack:
                last[ident] = stack
                _write(k="f", th=names.get(ident, str(ident)), stack=stack)


def _read(timeline: str) -> list[dict[str, Any]]:
    with open(timeline) as f:
        return [json.loads(line) for line in f if line.strip()]


def report(timeline: str, rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round (`start_t`/`end_t` in `rounds`), the step mix of `timeline`'s lines."""
    lines = _read(timeline)
    steps = [x for x in lines if x["k"] == "s"]
    updates = [x for x in lines if x["k"] == "u"]
    table = []
    for r in rounds:
        start, end = r["start_t"], r["end_t"]
        inside = [x for x in steps if start <= x["t"] <= end]
        times = [x["t"] for x in inside] + [end]
        kinds = {"idle": 0.0, "prefill": 0.0, "decode": 0.0}
        counts = dict.fromkeys(kinds, 0)
        decode_batch = 0.0
        for step, nxt in zip(inside, times[1:], strict=True):
            span = nxt - step["t"]
            kind = (
                "idle"
                if step["tokens"] == 0
                else "prefill"
                if step["tokens"] > step["reqs"]
                else "decode"
            )
            kinds[kind] += span
            counts[kind] += 1
            if kind == "decode":
                decode_batch += step["reqs"] * span
        loads = [x for x in updates if start <= x["t"] <= end and x["loaded"]]
        table.append(
            {
                "round": r["round"],
                "wall_s": round(end - start, 3),
                "before_first_step_s": round(times[0] - start, 3),
                "steps": {k: counts[k] for k in kinds},
                "seconds": {k: round(v, 3) for k, v in kinds.items()},
                "mean_decode_batch": round(decode_batch / kinds["decode"], 1)
                if kinds["decode"]
                else 0,
                "max_running": max((x["running"] for x in inside), default=0),
                "loads_done_at_s": [round(x["t"] - start, 3) for x in loads],
                "loads_done": [x["loaded"] for x in loads],
            }
        )
    return table


def stalls(timeline: str, rounds: list[dict[str, Any]], min_ms: float) -> list[str]:
    """Each step of rounds 1+ slower than `min_ms`, with the stacks each thread of every
    sampled process spent it in (longest first, at most three a thread)."""
    lines = _read(timeline)
    steps = [x for x in lines if x["k"] == "s"]
    frames = [x for x in lines if x["k"] == "f"]
    out = []
    for r in rounds[1:]:
        start, end = r["start_t"], r["end_t"]
        inside = [x for x in steps if start <= x["t"] <= end]
        sampled_pids = {x["pid"] for x in frames if start <= x["t"] <= end}
        for step, nxt in zip(inside, [x["t"] for x in inside[1:]] + [end], strict=True):
            span = nxt - step["t"]
            if span * 1e3 < min_ms:
                continue
            out.append(
                f"round {r['round']} +{(step['t'] - start) * 1e3:.0f} ms: {span * 1e3:.0f} ms, "
                f"{step['tokens']} tokens, {step['reqs']} requests ({step['new']} new)"
            )
            spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            current: dict[str, tuple[float, str]] = {}
            for x in frames:
                if x["pid"] not in sampled_pids or x["t"] > nxt:
                    continue
                thread = f"{x['pid']}:{x['th']}"
                begun, stack = current.get(thread, (x["t"], x["stack"]))
                if x["t"] > step["t"]:
                    spent[thread][stack] += x["t"] - max(begun, step["t"])
                current[thread] = (x["t"], x["stack"])
            for thread, (begun, stack) in current.items():
                spent[thread][stack] += nxt - max(begun, step["t"])
            for thread, stacks in spent.items():
                for stack, seconds in sorted(stacks.items(), key=lambda kv: -kv[1])[:3]:
                    if seconds * 1e3 >= 2 and not stack.startswith(_IDLE_FRAMES):
                        out.append(f"    {thread} {seconds * 1e3:6.1f} ms  {stack}")
    return out


def main() -> None:
    args = sys.argv[1:]
    min_ms = None
    if args[0] == "--stalls":
        min_ms, args = float(args[1]), args[2:]
    timeline, rounds_json = args
    with open(rounds_json) as f:
        rounds = json.load(f)["rounds"]
    if min_ms is not None:
        print("\n".join(stalls(timeline, rounds, min_ms)))
        return
    for row in report(timeline, rounds):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
