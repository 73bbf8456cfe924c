"""Where a multi-turn round's time goes: one line per scheduler step, and its report.

`install(path)` wraps vLLM's `Scheduler.schedule` and `Scheduler.update_from_output` (in
the process that calls it and in engine processes forked after it) so every step appends
one JSON line to `path`: `{"k": "s", ...}` when a step is scheduled (monotonic time, tokens
and requests scheduled, requests new to the batch, running, waiting) and `{"k": "u", ...}`
when its output comes back (loads and stores the connector reported finished). The clock
is `time.monotonic`, shared by every process of the host, so the benchmark's round
boundaries line up with the steps.

`python step_timeline.py TIMELINE ROUNDS_JSON` reports, per round: the steps, and the wall
time of the steps that computed nothing (waiting for loads), that carried prefill tokens,
and that only decoded; the mean decode batch; when the loads reported done.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

_ENV = "STEP_TIMELINE"
_sink: TextIO | None = None


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


def _write(**fields: Any) -> None:
    assert _sink is not None
    _sink.write(json.dumps({"t": round(time.monotonic(), 6), "pid": os.getpid(), **fields}) + "\n")


def report(timeline: str, rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round (`start_t`/`end_t` in `rounds`), the step mix of `timeline`'s lines."""
    with open(timeline) as f:
        lines = [json.loads(line) for line in f if line.strip()]
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


def main() -> None:
    timeline, rounds_json = sys.argv[1], sys.argv[2]
    with open(rounds_json) as f:
        rounds = json.load(f)["rounds"]
    for row in report(timeline, rounds):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
