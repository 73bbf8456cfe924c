"""Benchmark: operations per second at 1e3 to 1e7 tracked keys, bytes per key.

    python -m kv_eviction.sim.bench [--sizes 1e3,1e4,1e5,1e6,1e7] [--ops 200000] [--policies lru,marconi]

Keys are ints grouped in prefix chains of `--chain` blocks. For each policy and size N
the policy is filled with N keys and one victim is popped (so `auto` knows the cache is
full and runs its shadow caches), then `--ops` operations of each kind are timed on
top: `insert` (new chains; at most N/2 of them, as for `evict`), `touch` (hits walking whole random chains root to leaf, as
a prefix lookup does) and `evict` (`pop_victims(1)`, leaf-first; where N/2 is below
20,000, timed chunks of N/20 evictions alternate with untimed refills of as many keys,
so the size stays put, until 20,000 evictions are timed). Time is the process's
CPU time (so time spent descheduled by other load does not count); each phase runs in 10
chunks and the median chunk is kept, which discounts bursts of other load on a shared
machine (and a one-off `auto` rule switch, whose cost is reported separately); the
policies run interleaved `--rounds` times per size and the fastest round counts. The cost ratio is
ns/op at the largest size over ns/op at the smallest. Memory is measured separately
with tracemalloc (the caller's key objects excluded), after N inserts, one eviction and
N/2 touches.
For `auto`, the tuning overhead is its cost over `marconi`'s, and the extra cost of one
operation while a rule switch re-scores the tracked keys (16 per operation) is timed.
`auto-doorkeeper` is `auto` moved onto its `doorkeeper-lru` rule once full (inserts then
also look the key up in the ghost of evicted keys); `auto` stays on `lru` under this load. `naive sort` is the cost of one victim choice by sorting every key's score, which is
what a connector that sorts its free list on each store step pays.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence

from ..auto import AutoPolicy
from ..policy import EvictionPolicy, make_policy

DEFAULT_POLICIES = ("lru", "marconi", "auto", "auto-doorkeeper")
CHUNKS = 10
EVICT_MIN = 20_000
POLICY_OPTIONS: dict[str, dict[str, object]] = {
    "lru": {},
    "marconi": {"decay": 0.001, "reuse_mode": "log"},
    "auto": {},
}


def _make(name: str) -> EvictionPolicy:
    if name == "auto-doorkeeper":
        return AutoPolicy()
    return make_policy(name, **POLICY_OPTIONS.get(name, {}))


def _on_full(name: str, policy: EvictionPolicy) -> None:
    """After the first eviction: move `auto-doorkeeper` onto its doorkeeper rule."""
    if name == "auto-doorkeeper" and isinstance(policy, AutoPolicy):
        names = [c.name for c in policy.candidates]
        policy._switch(names.index("doorkeeper-lru"))
        policy.finish_rescore()


def _parse_sizes(text: str) -> list[int]:
    return [int(float(part)) for part in text.split(",") if part]


def _fill(policy: EvictionPolicy, keys: Sequence[int], chain: int, start: int = 0) -> None:
    insert = policy.insert
    for i in range(start, start + len(keys)):
        depth = i % chain
        insert(keys[i - start], keys[i - start - 1] if depth else None, depth)


def _timed(fn: Callable[[], int]) -> float:
    """Run `fn` (which returns how many operations it did); ns per operation."""
    gc.disable()
    try:
        t0 = time.process_time_ns()
        count = fn()
        elapsed = time.process_time_ns() - t0
    finally:
        gc.enable()
    return elapsed / max(count, 1)


def _timed_chunks(fn: Callable[[int, int], None], total: int, chunks: int = CHUNKS) -> float:
    """Run `fn(start, stop)` over `total` operations in chunks; median ns per operation.

    The median of the chunks discounts bursts of other load on a shared machine.
    """
    bounds = [total * i // chunks for i in range(chunks + 1)]
    costs = []
    for start, stop in itertools.pairwise(bounds):
        if stop > start:
            gc.disable()
            try:
                t0 = time.process_time_ns()
                fn(start, stop)
                elapsed = time.process_time_ns() - t0
            finally:
                gc.enable()
            costs.append(elapsed / (stop - start))
    return statistics.median(costs)


def measure_ops(name: str, size: int, ops: int, chain: int, seed: int) -> dict[str, float]:
    """ns per insert, touch and evict on a policy holding `size` keys."""
    rng = random.Random(seed)
    policy = _make(name)
    grow = min(ops, size // 2)  # inserts and evictions: keep the size within [N/2, 3N/2]
    keys = list(range(size + grow))
    _fill(policy, keys[:size], chain)
    for victim in policy.pop_victims(1):  # full: `auto` learns its capacity, shadows start
        assert isinstance(victim, int)
        policy.insert(victim, victim - 1 if victim % chain else None, victim % chain)
    _on_full(name, policy)
    result: dict[str, float] = {}
    insert = policy.insert

    def do_insert(start: int, stop: int) -> None:
        for i in range(size + start, size + stop):
            depth = i % chain
            insert(i, i - 1 if depth else None, depth)

    result["insert"] = _timed_chunks(do_insert, grow)
    chains = (size + grow) // chain
    roots = [rng.randrange(chains) * chain for _ in range(ops // chain)]
    touch = policy.touch
    tick = policy.tick

    def do_touch(start: int, stop: int) -> None:
        for root in roots[start:stop]:
            for key in range(root, root + chain):
                touch(key)
            tick()

    result["touch"] = _timed_chunks(do_touch, len(roots)) / chain
    pop = policy.pop_victims

    def do_evict(start: int, stop: int) -> None:
        for _ in range(stop - start):
            pop(1)

    if grow >= min(ops, EVICT_MIN):
        result["evict"] = _timed_chunks(do_evict, grow)
    else:  # small N: timed chunks of evictions alternate with untimed refills of the
        # same count, so the size stays put, until EVICT_MIN evictions are timed
        step = max(1, grow // CHUNKS)
        refill = size + grow
        costs: list[float] = []
        while len(costs) * step < min(ops, EVICT_MIN):
            costs.append(_timed_chunks(do_evict, step, chunks=1))
            _fill(policy, list(range(refill, refill + step)), chain, start=refill)
            refill += step
        result["evict"] = statistics.median(costs)
    if isinstance(policy, AutoPolicy):
        switch_to = policy.candidates[-1]

        def do_switch() -> int:
            policy.start_rescore(switch_to, len(policy))
            return policy.finish_rescore()

        result["switch"] = _timed(do_switch)
    return result


def measure_bytes(name: str, size: int, chain: int, seed: int) -> float:
    """Traced bytes per tracked key after `size` inserts, one eviction, `size // 2` touches."""
    rng = random.Random(seed)
    keys = list(range(size))
    touches = [rng.randrange(size) for _ in range(size // 2)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    policy = _make(name)
    _fill(policy, keys, chain)
    policy.pop_victims(1)
    _on_full(name, policy)
    for key in touches:
        if key not in policy:
            continue
        policy.touch(key)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del policy
    gc.collect()
    return used / size


def measure_naive_sort(size: int, seed: int) -> float:
    """ns for one victim choice by sorting all `size` Marconi scores."""
    rng = random.Random(seed)
    uses = [rng.randrange(1, 50) for _ in range(size)]
    depth = [i % 8 for i in range(size)]
    last = [rng.randrange(1000) for _ in range(size)]

    def once() -> int:
        now = 1000
        order = sorted(
            range(size), key=lambda i: uses[i] * 0.999 ** (now - last[i]) / (depth[i] + 1)
        )
        return 1 if order else 0

    return _timed(once)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kv_eviction.sim.bench", description=__doc__)
    parser.add_argument(
        "--sizes", default="1e3,1e4,1e5,1e6,1e7", help="tracked keys (default %(default)s)"
    )
    parser.add_argument("--ops", type=int, default=200_000, help="operations timed per kind")
    parser.add_argument("--chain", type=int, default=8, help="blocks per prefix chain")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--memory-sizes", default="1e6", help="sizes for bytes/key (tracemalloc)")
    parser.add_argument("--naive-sizes", default="1e5,1e6", help="sizes for the sort baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved runs per size; the fastest counts"
    )
    args = parser.parse_args(argv)
    sizes = _parse_sizes(args.sizes)
    policies = [p for p in args.policies.split(",") if p]
    kinds = ("insert", "touch", "evict")

    print(f"# kv-eviction benchmark: --ops {args.ops} --chain {args.chain}")
    print("| policy | entries | insert ops/s | touch ops/s | evict ops/s |")
    print("|---|---:|---:|---:|---:|")
    per_policy: dict[str, dict[int, dict[str, float]]] = {name: {} for name in policies}
    for size in sizes:
        for _ in range(args.rounds):  # interleaved, so load bursts hit every policy alike
            for name in policies:
                ns = measure_ops(name, size, args.ops, args.chain, args.seed)
                gc.collect()
                best = per_policy[name].setdefault(size, ns)
                for kind, value in ns.items():
                    best[kind] = min(best[kind], value)
        for name in policies:
            rates = " | ".join(f"{1e9 / per_policy[name][size][k]:,.0f}" for k in kinds)
            print(f"| {name} | {size:,} | {rates} |", flush=True)
    if len(sizes) > 1:
        lo, hi = min(sizes), max(sizes)
        print(f"\n| policy | cost ratio {hi:,} / {lo:,} entries: insert | touch | evict |")
        print("|---|---:|---:|---:|")
        for name, by_size in per_policy.items():
            ratios = " | ".join(f"{by_size[hi][k] / by_size[lo][k]:.2f}x" for k in kinds)
            print(f"| {name} | {ratios} |")
    for tuned in ("auto", "auto-doorkeeper"):
        if tuned not in per_policy or "marconi" not in per_policy:
            continue
        print(
            f"\n| entries | {tuned} / marconi cost: insert | touch | evict "
            "| re-score step after a switch |"
        )
        print("|---:|---:|---:|---:|---:|")
        for size in sizes:
            auto, marconi = per_policy[tuned][size], per_policy["marconi"][size]
            ratios = " | ".join(f"{auto[k] / marconi[k]:.2f}x" for k in kinds)
            print(f"| {size:,} | {ratios} | {auto['switch'] / 1e3:,.1f} µs |")
    print("\n| policy | entries | bytes per tracked key (tracemalloc) |")
    print("|---|---:|---:|")
    for name in policies:
        for size in _parse_sizes(args.memory_sizes):
            print(f"| {name} | {size:,} | {measure_bytes(name, size, args.chain, args.seed):.0f} |")
    naive = _parse_sizes(args.naive_sizes)
    if naive:
        print("\n| baseline | entries | one victim choice by full sort |")
        print("|---|---:|---:|")
        for size in naive:
            print(
                f"| naive sort | {size:,} | {measure_naive_sort(size, args.seed) / 1e6:,.1f} ms |"
            )


if __name__ == "__main__":
    main()
