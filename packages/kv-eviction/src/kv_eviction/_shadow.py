"""`auto`'s miniature simulation of one candidate rule on the sampled keys.

A shadow is a plain cache (no chains or pins: sampled keys rarely share a prefix) that
replays a batch of sampled accesses at once and reports which of them hit, so the Python
overhead of a call is paid per batch rather than per access. Recency rules keep their keys
in an `OrderedDict` (a hit moves the key to the end, the victim is the first key): no heap
and no stale items. Scored rules keep a heap of (rule key, sequence number, key) with
stale items skipped, as the main cache does. A doorkeeper's first-time keys wait in
`fresh` (oldest first, each with the clock of its insert), evicted first, or once older
than the probation window.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from ._ghost import Ghost, probe
from .candidate import GHOST_TURNOVERS, Candidate

__all__ = ["Access", "Shadow"]

Access = tuple[Hashable, int, int]
"""A sampled access: (key, depth, main-cache clock)."""


class Shadow:
    """One candidate's miniature cache; `replay` runs accesses, `end_epoch` folds counts.

    `hits`, `wins` and `losses` count this epoch's accesses (the owner sets wins and
    losses against the current rule); `score`, `lead` and `discord` are their averages.
    """

    __slots__ = (
        "candidate",
        "capacity",
        "discord",
        "entries",
        "fresh",
        "ghost",
        "heap",
        "hits",
        "lead",
        "limit",
        "losses",
        "order",
        "recency",
        "score",
        "seq",
        "window",
        "wins",
    )

    def __init__(self, candidate: Candidate) -> None:
        self.candidate = candidate
        self.recency = candidate.reuse == "recency"
        self.order: OrderedDict[Hashable, None] = OrderedDict()
        """Recency rules: the keys that are not first-time, least recently used first."""
        self.entries: dict[Hashable, list[int]] = {}
        """Scored rules: key -> [sequence number of its live heap item, uses, depth, clock
        at last use] for the keys that are not first-time."""
        self.heap: list[tuple[float, int, Hashable]] = []
        self.fresh: OrderedDict[Hashable, tuple[int, int]] = OrderedDict()
        """Doorkeepers: first-time keys not hit since, oldest first -> (insert clock, depth)."""
        # Doorkeepers: a key is first-time unless remembered as evicted, so before the
        # first eviction every key is (the main cache's rule too); `resize` sizes the ghost.
        self.ghost: Ghost | None = Ghost(1) if candidate.doorkeeper else None
        self.limit = 1 << 62
        """Keys held; unbounded until the main cache's capacity is known."""
        self.capacity = 0
        """The full-size cache's capacity C (the decay's unit)."""
        self.window = 0
        self.seq = 0
        self.hits = self.wins = self.losses = 0
        self.score = self.lead = self.discord = 0.0

    def __len__(self) -> int:
        return len(self.order) + len(self.entries) + len(self.fresh)

    def resize(
        self, limit: int, capacity: int, sampled: Callable[[Hashable], bool] | None = None
    ) -> None:
        """Hold `limit` keys for a cache of `capacity`, keeping only `sampled` keys."""
        self.limit = limit
        self.capacity = capacity
        candidate = self.candidate
        self.window = int(candidate.probation * capacity)
        if candidate.doorkeeper and capacity:
            window = max(1, GHOST_TURNOVERS * limit)
            if self.ghost is None or self.ghost.window != window:
                self.ghost = Ghost(window)
        if sampled is not None:
            self.order = OrderedDict((k, None) for k in self.order if sampled(k))
            self.entries = {k: e for k, e in self.entries.items() if sampled(k)}
            self.fresh = OrderedDict((k, f) for k, f in self.fresh.items() if sampled(k))
            self._rebuild()
        # keys already in the heap keep the decay of the old capacity until touched, as
        # in the main cache's incremental re-keying: no O(n) work per resize
        while len(self) > limit:
            self._evict(0)

    def _rebuild(self) -> None:
        """Re-key the heap (after a capacity change) and drop its stale items."""
        key = self.candidate.key_function(self.capacity)
        self.heap = [(key(e[1], e[2], e[3]), e[0], k) for k, e in self.entries.items()]
        heapq.heapify(self.heap)

    def replay(self, batch: Sequence[Access]) -> int:
        """Run `batch` in order; bit i of the result is set where access i hit."""
        if not self.recency:
            return self._replay_scored(batch)
        if self.ghost is None:
            return self._replay_lru(batch)
        return self._replay_doorkeeper(batch)

    # The loops below are the shadows' share of `auto`'s cost, so each kind has its own,
    # with the victim's choice (`_evict`) written out: a call per miss cost a quarter of
    # a replay. `tests/test_auto.py` pins that they evict exactly as `_evict` does.

    def _replay_lru(self, batch: Sequence[Access]) -> int:
        # no ghost (no doorkeeper): nothing is first-time (`fresh` stays empty), plain LRU
        order = self.order
        limit = self.limit
        hits = 0
        for i, access in enumerate(batch):
            key = access[0]
            if key in order:
                order.move_to_end(key)
                hits |= 1 << i
            else:
                order[key] = None
                if len(order) > limit:
                    order.popitem(last=False)
        return hits

    def _replay_doorkeeper(self, batch: Sequence[Access]) -> int:
        order = self.order
        fresh = self.fresh
        ghost = self.ghost
        assert ghost is not None
        generations, size, remember = ghost.generations, ghost.size, ghost.add
        limit = self.limit
        window = self.window
        hits = 0
        for i, (key, depth, clock) in enumerate(batch):
            if key in order:
                order.move_to_end(key)
                hits |= 1 << i
            elif key in fresh:
                del fresh[key]
                order[key] = None
                hits |= 1 << i
            else:
                if probe(generations, size, key):
                    order[key] = None
                else:
                    fresh[key] = (clock, depth)
                if len(order) + len(fresh) > limit:
                    # the oldest first-time key once out of its window, else LRU
                    if fresh and (not order or next(iter(fresh.values()))[0] + window <= clock):
                        remember(fresh.popitem(last=False)[0])
                    else:
                        remember(order.popitem(last=False)[0])
        return hits

    def _replay_scored(self, batch: Sequence[Access]) -> int:
        entries = self.entries
        fresh = self.fresh
        heap = self.heap
        ghost = self.ghost
        generations, size = (ghost.generations, ghost.size) if ghost else ([], 0)
        limit = self.limit
        window = self.window
        rule_key = self.candidate.key_function(self.capacity)
        push, pop = heapq.heappush, heapq.heappop
        seq = self.seq
        hits = 0
        for i, (key, depth, clock) in enumerate(batch):
            seq += 1
            entry = entries.get(key)
            if entry is None and key in fresh:
                depth = fresh.pop(key)[1]
                entry = entries[key] = [0, 1, depth, 0]
            if entry is not None:
                uses = entry[1] + 1
                entry[0] = seq
                entry[1] = uses
                entry[3] = clock
                push(heap, (rule_key(uses, entry[2], clock), seq, key))
                hits |= 1 << i
                continue
            if ghost is not None and not probe(generations, size, key):
                fresh[key] = (clock, depth)
            else:
                entries[key] = [seq, 1, depth, clock]
                push(heap, (rule_key(1, depth, clock), seq, key))
            if len(entries) + len(fresh) > limit:
                # the oldest first-time key once out of its window, else the heap's top
                if fresh and (not entries or next(iter(fresh.values()))[0] + window <= clock):
                    victim = fresh.popitem(last=False)[0]
                else:
                    while True:  # entries is not empty: its live items are in the heap
                        _, victim_seq, victim = pop(heap)
                        entry = entries.get(victim)
                        if entry is not None and entry[0] == victim_seq:
                            break  # else stale
                    del entries[victim]
                if ghost is not None:
                    ghost.add(victim)
        self.seq = seq
        if len(heap) > 2 * len(entries) + 64:
            self._rebuild()
        return hits

    def _evict(self, clock: int) -> None:
        fresh = self.fresh
        held = self.order if self.recency else self.entries
        if fresh and (not held or next(iter(fresh.values()))[0] + self.window <= clock):
            key = fresh.popitem(last=False)[0]
        elif self.recency:
            if not held:
                return
            key = self.order.popitem(last=False)[0]
        else:
            entries = self.entries
            heap = self.heap
            while True:
                if not heap:
                    return
                _, seq, key = heapq.heappop(heap)
                entry = entries.get(key)
                if entry is not None and entry[0] == seq:
                    break  # else stale
            del entries[key]
        if self.ghost is not None:
            self.ghost.add(key)

    def end_epoch(self, keep: float) -> None:
        """Fold this epoch's counts into the averages (weight `keep` on the past)."""
        self.score = keep * self.score + (1.0 - keep) * self.hits
        self.lead = keep * self.lead + (1.0 - keep) * (self.wins - self.losses)
        self.discord = keep * self.discord + (1.0 - keep) * (self.wins + self.losses)
        self.hits = self.wins = self.losses = 0
