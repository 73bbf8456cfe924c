"""Reuse structure of a Mooncake-format trace, and what Bélády keeps that LRU does not.

    python packages/kv-eviction/benchmarks/mooncake_reuse.py [--trace PATH] [--capacity 2000]

Prints (all from the trace alone, no tuning):

1. reuse gaps (in requests) by how often the block's chain root was requested before;
2. P(a block is used again | its uses so far);
3. block reuses that LRU and Bélády serve at `--capacity`, by gap since the previous use;
   and per class (uses so far x gap since the previous use), the share of accesses whose
   next use Bélády serves: how well those online-visible features separate what the
   optimum keeps from what it drops;
4. token hit rate of three heap-compatible rules built on those features, next to LRU and
   Bélády: fresh blocks evicted before reused ones; a new suffix after a prefix hit aged by
   one turnover; a hash-chosen quarter of the chain roots kept 2 turnovers longer (a
   stable subset, as bimodal insertion does against thrashing); and `auto`'s doorkeeper
   rule held fixed (blocks stored for the first time are evicted first);
5. oracles that bound what better predictions of those kinds could give: LRU that is
   told which accesses are a block's last (dead blocks are evicted first); LRU that is told
   only which blocks are used once (a perfect doorkeeper); LFU that is told every block's
   total use count in the trace; and a policy told each block's future rate (its remaining
   uses over the requests until its last use, 0 once dead), which keeps the blocks an
   independent-reference model says to keep.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable

from kv_eviction import make_policy
from kv_eviction.auto import Candidate, CandidatePolicy
from kv_eviction.chainheap import SEQ_BITS, ChainHeapPolicy
from kv_eviction.policy import EvictionPolicy
from kv_eviction.sim import BeladyPolicy, simulate
from kv_eviction.sim.cli import load_trace
from kv_eviction.sim.trace import Trace

_BASE = 1 << 40  # keeps shifted clocks positive
_MULT = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


class _ClockRule(ChainHeapPolicy):
    """LRU on a block clock, with a per-key shift (in blocks) chosen by `_shift`."""

    name = "rule"

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0
        self._uses = array("I")
        self._flag = bytearray()

    def _grow(self) -> None:
        self._uses.append(0)
        self._flag.append(0)

    def _shift(self, slot: int) -> int:
        return 0

    def _item(self, slot: int, seq: int) -> int:
        return ((_BASE + self.clock + self._shift(slot)) << SEQ_BITS) | seq

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        self.clock += 1
        self._uses[slot] = 1
        self._on_insert(slot)
        return self._item(slot, seq)

    def _on_insert(self, slot: int) -> None:
        pass

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        self.clock += 1
        self._uses[slot] += 1
        return self._item(slot, seq)


class FreshFirst(_ClockRule):
    """Blocks never hit are evicted before any block that was hit (LRU within each)."""

    name = "fresh-first"

    def _shift(self, slot: int) -> int:
        return 0 if self._uses[slot] == 1 else _BASE


class SuffixDemote(_ClockRule):
    """A new block whose parent was hit (the new suffix after a prefix hit) is one
    turnover older at insert."""

    name = "suffix-demote"

    def _on_insert(self, slot: int) -> None:
        parent = self._parent[slot]
        self._flag[slot] = parent >= 0 and self._uses[parent] >= 2

    def _shift(self, slot: int) -> int:
        return -len(self._index) if self._flag[slot] and self._uses[slot] == 1 else 0


class RootSubset(_ClockRule):
    """Chains whose root hash falls in a quarter of the hash space live 2 turnovers longer."""

    name = "root-subset"

    def _on_insert(self, slot: int) -> None:
        parent = self._parent[slot]
        if parent >= 0:
            self._flag[slot] = self._flag[parent]
        else:
            self._flag[slot] = (hash(self._keys[slot]) * _MULT) & _MASK64 < 1 << 62

    def _shift(self, slot: int) -> int:
        return 2 * len(self._index) if self._flag[slot] else 0


class FixedDoorkeeper(CandidatePolicy):
    """`auto`'s `doorkeeper-lru` rule from the start; its ghost is sized at the first eviction."""

    name = "doorkeeper-lru"

    def __init__(self) -> None:
        super().__init__(Candidate("doorkeeper-lru", reuse="recency", doorkeeper=True))

    def pop_victims(self, n: int) -> list[Hashable]:
        if self.ghost is None:
            self.set_ghost(len(self))
        return super().pop_victims(n)


class _TotalUsesOracle(_ClockRule):
    """A rule told every block's total use count in the trace."""

    def __init__(self, total_uses: Counter[Hashable]) -> None:
        super().__init__()
        self._total = total_uses


class DeadFirstOracle(_TotalUsesOracle):
    """LRU, except that a block whose access was its last in the trace is evicted first."""

    name = "oracle: dead blocks first"

    def __init__(self, total_uses: Counter[Hashable]) -> None:
        super().__init__(total_uses)
        self._seen: Counter[Hashable] = Counter()

    def _shift(self, slot: int) -> int:
        key = self._keys[slot]
        self._seen[key] += 1
        return 0 if self._seen[key] >= self._total[key] else _BASE


class OneShotOracle(_TotalUsesOracle):
    """LRU, except that a block used only once in the whole trace is evicted first."""

    name = "oracle: one-shot blocks first"

    def _shift(self, slot: int) -> int:
        return 0 if self._total[self._keys[slot]] == 1 else _BASE


class FutureRateOracle(_ClockRule):
    """Evicts the lowest future rate: remaining uses / requests until the last use (0: dead).

    The request clock is the simulator's one tick per request; ties go to the least
    recently used.
    """

    name = "oracle: lowest future rate first"
    _SCALE = 1 << 20

    def __init__(self, uses: dict[Hashable, list[int]]) -> None:
        super().__init__()
        self._uses_at = uses
        self.request = 0

    def tick(self, n: int = 1) -> None:
        super().tick(n)
        self.request += n

    def _shift(self, slot: int) -> int:
        at = self._uses_at[self._keys[slot]]
        later = len(at) - bisect.bisect_right(at, self.request)
        if later == 0:
            return 0
        rate = later / (at[-1] - self.request + 1)
        return (1 + int(rate * self._SCALE)) * _BASE


class FrequencyOracle(_TotalUsesOracle):
    """LFU on every block's total use count in the trace; ties to the least recently used."""

    name = "oracle: LFU on total uses"

    def _shift(self, slot: int) -> int:
        return self._total[self._keys[slot]] * _BASE


def _gap_bucket(gap: int | None) -> str:
    if gap is None:
        return "first use"
    for bound in (30, 100, 300):
        if gap < bound:
            return f"<{bound}"
    return ">=300"


def reuse_structure(trace: Trace) -> None:
    root_seen: Counter[Hashable] = Counter()
    last: dict[Hashable, int] = {}
    gaps: defaultdict[int, list[int]] = defaultdict(list)
    uses: Counter[Hashable] = Counter()
    for index, request in enumerate(trace.requests):
        if not request.blocks:
            continue
        seen = min(root_seen[request.blocks[0]], 5)
        for key in request.blocks:
            if key in last:
                gaps[seen].append(index - last[key])
            last[key] = index
            uses[key] += 1
        root_seen[request.blocks[0]] += 1
    once = sum(1 for count in root_seen.values() if count == 1)
    single = sum(1 for count in uses.values() if count == 1)
    print(
        f"{len(root_seen):,} chain roots, {once:,} of them requested once; "
        f"{single:,} of {len(uses):,} unique blocks used once\n"
    )
    print("## Reuse gap (requests) by requests of the chain root seen before\n")
    print("| root seen before | reuses | p10 | median | p75 |\n|---:|---:|---:|---:|---:|")
    for seen, values in sorted(gaps.items()):
        values.sort()
        label = f"{seen}+" if seen == 5 else str(seen)
        print(
            f"| {label} | {len(values):,} | {values[len(values) // 10]} "
            f"| {statistics.median(values):.0f} | {values[3 * len(values) // 4]} |"
        )
    total: Counter[int] = Counter()
    again: Counter[int] = Counter()
    for count in uses.values():
        for k in range(1, count + 1):
            total[min(k, 5)] += 1
            again[min(k, 5)] += k < count
    print("\n## P(used again | uses so far)\n")
    print("| uses so far | blocks | P(used again) |\n|---:|---:|---:|")
    for k in sorted(total):
        label = f"{k}+" if k == 5 else str(k)
        print(f"| {label} | {total[k]:,} | {again[k] / total[k]:.2f} |")


def _served(trace: Trace, policy: EvictionPolicy, capacity: int) -> set[tuple[Hashable, int]]:
    """(key, request index) of every block reuse served from the cache."""
    served: set[tuple[Hashable, int]] = set()
    touch = policy.touch

    def recording_touch(key: Hashable) -> None:
        served.add((key, policy.stats().now))
        touch(key)

    policy.touch = recording_touch  # type: ignore[method-assign]
    simulate(trace, policy, capacity)
    return served


def belady_keeps(trace: Trace, capacity: int) -> None:
    requests = trace.requests
    served = _served(trace, BeladyPolicy.for_requests(r.blocks for r in requests), capacity)
    by_lru = _served(trace, make_policy("lru"), capacity)
    last_seen: dict[Hashable, int] = {}
    counts: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    for index, request in enumerate(requests):
        for key in request.blocks:
            if key in last_seen:
                row = counts[_gap_bucket(index - last_seen[key])]
                row[0] += (key, index) in by_lru
                row[1] += (key, index) in served
            last_seen[key] = index
    print(f"\n## Block reuses served at {capacity:,} blocks, by gap since the previous use\n")
    print("| gap (requests) | LRU | Bélády |\n|---|---:|---:|")
    for bucket in ("<30", "<100", "<300", ">=300"):
        print(f"| {bucket} | {counts[bucket][0]:,} | {counts[bucket][1]:,} |")
    print(f"| all | {len(by_lru):,} | {len(served):,} |")
    when: defaultdict[Hashable, list[int]] = defaultdict(list)
    for index, request in enumerate(requests):
        for key in request.blocks:
            when[key].append(index)
    rows: defaultdict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    uses: Counter[Hashable] = Counter()
    last: dict[Hashable, int] = {}
    for index, request in enumerate(requests):
        for key in request.blocks:
            times = when[key]
            later = bisect.bisect_right(times, index)
            since = index - last[key] if key in last else None
            row = rows[(min(uses[key], 3), _gap_bucket(since))]
            row[0] += 1
            if later < len(times):
                row[1] += 1
                row[2] += (key, times[later]) in served
            uses[key] += 1
            last[key] = index
    accesses = sum(r[0] for r in rows.values())
    print(f"\n## What Bélády keeps at {capacity:,} blocks, by class at the access\n")
    print(
        "| uses before | gap since previous use | accesses | P(used again) | P(Bélády hit next) |"
    )
    print("|---:|---|---:|---:|---:|")
    for (used, bucket), (n, reused, hit) in sorted(
        rows.items(), key=lambda kv: -kv[1][2] / kv[1][0]
    ):
        if n >= accesses // 200:
            label = f"{used}+" if used == 3 else str(used)
            print(f"| {label} | {bucket} | {n:,} | {reused / n:.2f} | {hit / n:.2f} |")


def rules(trace: Trace, capacities: list[int]) -> None:
    uses_at: defaultdict[Hashable, list[int]] = defaultdict(list)
    for index, request in enumerate(trace.requests):
        for key in set(request.blocks):
            uses_at[key].append(index)
    total = Counter({key: len(at) for key, at in uses_at.items()})
    makers: list[tuple[str, Callable[[], EvictionPolicy]]] = [
        ("lru", lambda: make_policy("lru")),
        ("fresh-first", FreshFirst),
        ("suffix-demote", SuffixDemote),
        ("root-subset", RootSubset),
        ("doorkeeper-lru (fixed)", FixedDoorkeeper),
        (DeadFirstOracle.name, lambda: DeadFirstOracle(total)),
        (OneShotOracle.name, lambda: OneShotOracle(total)),
        (FrequencyOracle.name, lambda: FrequencyOracle(total)),
        (FutureRateOracle.name, lambda: FutureRateOracle(uses_at)),
    ]
    print("\n## Token hit rate of rules on those features\n")
    print("| rule | " + " | ".join(f"{c:,}" for c in capacities) + " |")
    print("|---|" + "---:|" * len(capacities))
    for label, maker in makers:
        cells = []
        for capacity in capacities:
            policy = maker()
            cells.append(f"{100 * simulate(trace, policy, capacity).token_hit_rate:.1f}%")
        print(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for capacity in capacities:
        oracle = BeladyPolicy.for_requests(r.blocks for r in trace.requests)
        cells.append(f"{100 * simulate(trace, oracle, capacity).token_hit_rate:.1f}%")
    print("| belady | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="mooncake", help="a trace name or a Mooncake path")
    parser.add_argument("--capacity", type=int, default=2000, help="blocks, for the Bélády table")
    parser.add_argument("--rule-capacities", default="2000,4000,8000")
    args = parser.parse_args()
    trace = load_trace(args.trace)
    reuse_structure(trace)
    belady_keeps(trace, args.capacity)
    rules(trace, [int(c) for c in args.rule_capacities.split(",")])


if __name__ == "__main__":
    main()
