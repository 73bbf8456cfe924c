"""The L1 policy's own cost on the calls of a recorded step-benchmark run.

`bench_eviction_step.py --record DIR` writes every call the connector made to the L1
policy (fill and timed steps). This replays the calls of the timed steps, after the fill,
on fresh instances of the given policies and reports their process CPU per timed step:
the policy's share of a scheduler step, without the scheduler, the loads and the noise
of a vLLM process. The policies advance together, 1,000 calls at a time in a random
order per chunk, so load that changes during a round touches them alike; per policy the
median of `--rounds` rounds counts.

A policy other than the recorded one may evict other keys; then the calls that follow do
not fit it, and it is reported as `diverges` (the recorded policy itself always fits: the
replay checks every victim count). Run under the PYTHONHASHSEED of the recording.

    PYTHONHASHSEED=0 python replay_eviction_calls.py DIR/auto-65536-0.pkl --policies lru,auto

`--base` as in `bench_eviction_step.py`: `--policies lru,auto@base,auto --base DIR` times
the package in DIR (say, main's) and this one on the same calls.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import random
import statistics
import time
from collections import Counter
from typing import Any

from bench_eviction_step import parse_policy, register_base
from kv_eviction import EvictionPolicy, make_policy

CHUNK = 1000

Call = tuple[Any, ...]


class DivergedError(Exception):
    """The policy's victims differ from the recording's."""


def load(path: str) -> tuple[str, list[Call], list[Call], int]:
    """The recorded policy, the L1 policy's fill and timed calls, and the timed steps."""
    with open(path, "rb") as file:
        recording = pickle.load(file)
    if recording["probe"] != hash(b"probe"):
        raise SystemExit(f"{path}: run with the PYTHONHASHSEED the recording was made with")
    calls = recording["calls"]
    l1 = Counter(call[0] for call in calls if isinstance(call[0], int)).most_common(1)[0][0]
    timed = calls.index(("timed",))
    fill = [call[1:] for call in calls[:timed] if call[0] == l1]
    steps = [call[1:] for call in calls[timed:] if call[0] == l1]
    return recording["policy"], fill, steps, calls[timed:].count(("step",))


def replay(policy: EvictionPolicy, calls: list[Call]) -> None:
    """Make `calls` on `policy`; `DivergedError` where they stop fitting it."""
    try:
        for name, *args in calls:
            if name == "pop_victims":
                if len(policy.pop_victims(args[0])) != args[1]:
                    raise DivergedError
            else:
                getattr(policy, name)(*args)
    except KeyError:
        raise DivergedError from None  # a call on a key this policy had evicted


def measure(
    fill: list[Call], timed: list[Call], names: list[str], base: str = ""
) -> dict[str, float]:
    """One round: process CPU seconds of each policy over `timed` (inf: diverged)."""
    policies: dict[str, EvictionPolicy] = {}
    seconds: dict[str, float] = {}
    for name in names:
        label, options = parse_policy(name)
        register_base(label, base)
        policies[name] = make_policy(label, **options)
        seconds[name] = 0.0
        try:
            replay(policies[name], fill)
        except DivergedError:
            seconds[name] = float("inf")
    gc.collect()
    for start in range(0, len(timed), CHUNK):
        chunk = timed[start : start + CHUNK]
        for name in random.sample(names, len(names)):
            if seconds[name] == float("inf"):
                continue
            t0 = time.process_time()
            try:
                replay(policies[name], chunk)
            except DivergedError:
                seconds[name] = float("inf")
                continue
            seconds[name] += time.process_time() - t0
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recordings", nargs="+")
    parser.add_argument(
        "--policies", default="", help="as bench_eviction_step's; default: the recorded one"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", default="", help="kv_eviction package folder for NAME@base")
    args = parser.parse_args()
    print("| recording | timed steps | calls per step | policy: ms per step (x first) |")
    print("|---|---:|---:|---|")
    for path in args.recordings:
        recorded, fill, timed, steps = load(path)
        names = args.policies.split(",") if args.policies else [recorded]
        rounds = [measure(fill, timed, names, args.base) for _ in range(args.rounds)]
        median = {name: statistics.median(r[name] for r in rounds) for name in names}
        cells = []
        for name in names:
            if median[name] == float("inf"):
                cells.append(f"{name} diverges")
            elif median[names[0]] == float("inf"):
                cells.append(f"{name} {1e3 * median[name] / steps:.2f}")
            else:
                ratio = median[name] / median[names[0]]
                cells.append(f"{name} {1e3 * median[name] / steps:.2f} ({ratio:.2f}x)")
        print(f"| {path} | {steps} | {len(timed) / steps:,.0f} | {', '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
