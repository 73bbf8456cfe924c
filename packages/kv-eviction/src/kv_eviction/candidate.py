"""Scoring rules (`Candidate`), the policy that orders keys by one, and the named rules.

A rule is a point of one family, computed in log space and fixed between touches (so the
lazy heap of `ChainHeapPolicy` applies unchanged):

    log score = log(reuse) - depth_weight x log(depth + 1) + (c / C) x last_use

with `reuse` the use count (`linear`) or log1p of it (`log`), `last_use` the value of an
internal clock that counts inserted blocks, and `C` the cache's capacity in blocks.
Measuring age in inserted blocks and scaling the decay by the capacity makes `c` the
decay per cache turnover, a unit that means the same at every size and rate; `recency`
is LRU.

A rule may also be a *doorkeeper* (the admission idea of TinyLFU, Einziger et al., ACM
TOS 2017, and of 2Q's ghost queue, Johnson and Shasha, VLDB '94, applied inside the
eviction order since every block is stored): a block stored for the first time, i.e. not
evicted within the last `GHOST_TURNOVERS` to twice that many turnovers (a Bloom-filter
ghost of evicted keys, `_ghost.py`), and not hit since, is evicted before every other
block, oldest first. With a *probation window* (S3-FIFO's small queue, Yang et al., SOSP
'23, which gives new objects 10% of the cache) a first-time block is first kept like any
other block for `probation` capacities' worth of inserted blocks, so a block reused soon
after its first use (the next turn of a chat) survives, while one-shot blocks still leave
before blocks that came back.

The named policies `doorkeeper-lru`, `doorkeeper-lfu-decay-1` and `probation-lru` are
such rules held fixed (`RulePolicy`); `auto` chooses among them and the frequency rules.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ._ghost import Ghost, probe
from .chainheap import SEQ_BITS, SLOT_BITS, SLOT_MASK, ChainHeapPolicy
from .marconi import float_order_bits
from .policy import reject_unknown_options

__all__ = [
    "DOORKEEPER_LFU",
    "DOORKEEPER_LRU",
    "GHOST_TURNOVERS",
    "LRU",
    "PROBATION_BASE",
    "PROBATION_LRU",
    "Candidate",
    "CandidatePolicy",
    "RulePolicy",
]

SEQ_MASK = (1 << SEQ_BITS) - 1
S3FIFO_WINDOW = 0.1
"""The probation window of `probation-lru`: S3-FIFO's small-queue share of the cache."""


@dataclass(frozen=True)
class Candidate:
    """One scoring rule: `lru`, or reuse / (depth + 1)^depth_weight with decay `c`."""

    name: str
    reuse: str = "linear"
    """`linear` (use count), `log` (log1p of the use count) or `recency` (LRU)."""
    depth_weight: float = 0.0
    decay_per_turnover: float = 0.0
    doorkeeper: bool = False
    """Blocks stored for the first time (not evicted within the last few turnovers) and
    not hit since are evicted before every other block, oldest first."""
    probation: float = 0.0
    """With `doorkeeper`: a first-time block is kept like any other block for this many
    capacities' worth of inserted blocks (its probation window) before it goes below
    every other block; 0 sends it there at once."""

    @property
    def keyed_by_capacity(self) -> bool:
        """Whether the rule's keys depend on the capacity (only through a decay): if not,
        a new capacity leaves every tracked key as it is."""
        return self.reuse != "recency" and self.decay_per_turnover != 0

    def log_key(self, uses: int, depth: int, last_use: int, capacity: int) -> float:
        """The rule's log-space key (lower is evicted first)."""
        return self.key_function(capacity)(uses, depth, last_use)

    def key_function(self, capacity: int) -> Callable[[int, int, int], float]:
        """`log_key` for one capacity, as a function of (uses, depth, last use)."""
        decay = self.decay_per_turnover / max(capacity, 1)
        weight = self.depth_weight
        log, log1p = math.log, math.log1p
        if self.reuse == "recency":
            return lambda uses, depth, last_use: 0.0
        if self.reuse == "linear":
            return lambda uses, depth, last_use: (
                log(uses) - weight * log1p(depth) + decay * last_use
            )
        return lambda uses, depth, last_use: (
            log(log1p(uses)) - weight * log1p(depth) + decay * last_use
        )


GHOST_TURNOVERS = 4
"""The doorkeeper's memory: keys evicted within the last 4 to 8 capacities' worth of
evictions count as seen before (16 bytes per tracked key, see `_ghost.py`)."""
PROBATION_BASE = -1 << SEQ_BITS
"""Priority base of a doorkeeper's first-time block: below every other rule's priority."""


class CandidatePolicy(ChainHeapPolicy):
    """Keys ordered by one `Candidate` rule; the base of `auto` and of its shadows."""

    # see ChainHeapPolicy's slots
    __slots__ = (
        "_depth",
        "_doorkeeper",
        "_first_time",
        "_last",
        "_log_key",
        "_recency",
        "_resize_above",
        "_resize_below",
        "_uses",
        "_window",
        "candidate",
        "capacity",
        "clock",
        "ghost",
    )

    name = "candidate"

    def __init__(self, candidate: Candidate, capacity: int = 0) -> None:
        super().__init__()
        self.candidate = candidate
        self.capacity = capacity
        """Capacity C used by the decay; 0 until known. Both change only by `_set_rule`."""
        self._set_rule(candidate, capacity)
        self.clock = 0
        """Inserted blocks so far: the age unit."""
        self.ghost: Ghost | None = None
        """Recently evicted keys, while a doorkeeper needs them (`set_ghost`)."""
        self._uses = array("I")
        self._depth = array("I")
        self._last = array("q")
        self._first_time = bytearray()

    def _set_rule(self, candidate: Candidate, capacity: int) -> None:
        """Order new and re-keyed keys by `candidate` at `capacity`."""
        self.candidate = candidate
        self.capacity = capacity
        self._recency = candidate.reuse == "recency"
        self._doorkeeper = candidate.doorkeeper
        self._log_key = candidate.key_function(capacity)
        self._window = candidate.probation * capacity
        self._side_hold = self._window > 0
        # the owner's capacity is re-read when the tracked keys leave this band (25%)
        self._resize_above = capacity * 1.25
        self._resize_below = capacity * 0.8

    def _grow(self) -> None:
        self._uses.append(0)
        self._depth.append(0)
        self._last.append(0)
        self._first_time.append(0)

    def set_ghost(self, capacity: int) -> None:
        """Size the doorkeeper's memory for `capacity` keys (kept if already that size)."""
        window = max(1, GHOST_TURNOVERS * capacity)
        if self.ghost is None or self.ghost.window != window:
            self.ghost = Ghost(window)

    def _side_first(self) -> bool:
        side = self._side
        index = self._index
        keys = self._keys
        while side and index.get(keys[side[0] & SLOT_MASK]) != side[0]:
            heapq.heappop(side)  # garbage: the first-time key was hit, evicted or removed
        return bool(side) and self._last[side[0] & SLOT_MASK] + self._window <= self.clock

    def pop_victims(self, n: int) -> list[Hashable]:
        victims = ChainHeapPolicy.pop_victims(self, n)
        if self.ghost is not None:
            self._remember(victims)
        return victims

    def _remember(self, victims: list[Hashable]) -> None:
        """Add evicted keys to the doorkeeper's ghost (the caller checked it exists)."""
        self.ghost.add_all(victims)  # type: ignore[union-attr]

    def remove(self, key: Hashable) -> None:
        super().remove(key)
        if self.ghost is not None:
            self.ghost.add(key)

    def _priority(self, slot: int, seq: int) -> int:
        if self._doorkeeper and self._first_time[slot]:
            return PROBATION_BASE | seq
        if self._recency:
            return seq
        key = self._log_key(self._uses[slot], self._depth[slot], self._last[slot])
        return (float_order_bits(key) << SEQ_BITS) | seq

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        self.clock = clock = self.clock + 1
        first_time = 0  # not looked up unless a doorkeeper rule: ordered as seen before
        if self._doorkeeper:
            ghost = self.ghost
            parent = self._parent[slot]
            if ghost is None or (parent >= 0 and self._first_time[parent]):
                # a block whose prefix is new is new: its hash covers the prefix, and a
                # child leaves the cache (and enters the ghost) before its parent
                first_time = 1
            elif not probe(ghost.generations, ghost.size, self._keys[slot]):
                first_time = 1  # the doorkeeper's per-insert cost: one ghost probe
        self._first_time[slot] = first_time
        self._uses[slot] = 1
        self._depth[slot] = depth
        self._last[slot] = clock
        if first_time:
            return PROBATION_BASE | seq
        if self._recency:
            return seq  # LRU keys are the sequence number
        return self._priority(slot, seq)

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        self._first_time[slot] = 0
        uses = self._uses[slot]
        if uses < 0xFFFFFFFF:
            uses += 1
            self._uses[slot] = uses
        self._last[slot] = self.clock
        if self._recency:
            return seq  # a hit ends probation; LRU keys are the sequence number
        key = self._log_key(uses, self._depth[slot], self.clock)
        return (float_order_bits(key) << SEQ_BITS) | seq

    def rescore(self, candidate: Candidate, capacity: int) -> None:
        """Switch rule and/or capacity: re-key every tracked key, keeping recency ties."""
        self._set_rule(candidate, capacity)
        index = self._index
        for key, item in index.items():
            slot = item & SLOT_MASK
            seq = (item >> SLOT_BITS) & SEQ_MASK
            priority = self._priority(slot, seq) + self._retention_offset(slot)
            index[key] = (priority << SLOT_BITS) | slot
        self._compact()


LRU = Candidate("lru", reuse="recency")
DOORKEEPER_LRU = Candidate("doorkeeper-lru", reuse="recency", doorkeeper=True)
DOORKEEPER_LFU = Candidate("doorkeeper-lfu-decay-1", decay_per_turnover=1.0, doorkeeper=True)
PROBATION_LRU = Candidate(
    "probation-lru", reuse="recency", doorkeeper=True, probation=S3FIFO_WINDOW
)


class RulePolicy(CandidatePolicy):
    """One `Candidate` rule held fixed, as a policy of its own.

    Like `auto` it reads the capacity as the number of tracked keys when `pop_victims`
    is called and re-reads it when that number moves by more than 25%; at the first
    reading a rule whose keys depend on the capacity (a decay) re-keys every tracked key,
    once, in that call.
    """

    def __init__(self, candidate: Candidate) -> None:
        super().__init__(candidate)
        self.name = candidate.name

    def pop_victims(self, n: int) -> list[Hashable]:
        size = len(self._index)
        if size > self._resize_above or size < self._resize_below:
            if not self.candidate.keyed_by_capacity or self.capacity:
                # keys without a decay do not depend on the capacity; after the first
                # reading, keys keep the old capacity's decay until touched (at most 25% off)
                self._set_rule(self.candidate, size)
            else:
                self.rescore(self.candidate, size)  # once: the keys so far had no capacity
            if self.candidate.doorkeeper:
                self.set_ghost(size)
        return super().pop_victims(n)


def _rule_factory(candidate: Candidate) -> Callable[..., RulePolicy]:
    def build(**options: Any) -> RulePolicy:
        reject_unknown_options(candidate.name, options, ())
        return RulePolicy(candidate)

    return build


# The `make_policy` factories of the fixed rules (registered in `builtin_policies`).
build_doorkeeper_lru = _rule_factory(DOORKEEPER_LRU)
build_doorkeeper_lfu = _rule_factory(DOORKEEPER_LFU)
build_probation_lru = _rule_factory(PROBATION_LRU)
