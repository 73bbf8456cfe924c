"""`auto`: a policy that picks its own scoring rule by miniature simulation.

The main cache orders keys by one *candidate* rule at a time. Every candidate is a
point of one family, computed in log space and fixed between touches (so the lazy heap
of `ChainHeapPolicy` applies unchanged):

    log score = log(reuse) - depth_weight x log(depth + 1) + (c / C) x last_use

with `reuse` the use count (`linear`) or log1p of it (`log`), `last_use` the value of an
internal clock that counts inserted blocks, and `C` the cache's capacity in blocks.
Measuring age in inserted blocks and scaling the decay by the capacity makes `c` the
decay per cache turnover, a unit that means the same at every size and rate, so no
candidate is tuned to one trace; `lru` is the candidate with pure recency.

A candidate may also be a *doorkeeper* (the admission idea of TinyLFU, Einziger et al.,
ACM TOS 2017, and of 2Q's ghost queue, Johnson and Shasha, VLDB '94, applied inside the
eviction order since every block is stored): a block stored for the first time, i.e. not
evicted within the last `GHOST_TURNOVERS` to twice that many turnovers (a Bloom-filter
ghost of evicted keys, `_ghost.py`), and not hit since, is evicted before every other
block, oldest first. Where most blocks are used once and the rest return after longer
than one turnover (long-document QA, RAG questions), LRU's horizon is spent on one-shot
blocks; the doorkeeper gives it to blocks that have come back. Where the next request
reuses what was just written (multi-turn chat, agents), it is wrong, and the shadows
keep it out. The main cache keeps a ghost from the first epoch in which a doorkeeper leads
the shadows until it switches from a doorkeeper to a rule without one, and looks a stored
key up only while a doorkeeper rule is current; after a switch to one, the re-scoring pass
looks up the keys stored before it that were never hit.

Alongside, each candidate runs a miniature simulation (Waldspurger et al., "Cache
Modeling and Optimization using Miniature Simulations", USENIX ATC '17): a shadow cache
that sees only the keys whose hash falls in a sample of rate R = min(1, S / C) and holds
R x C keys, so it behaves like the full-size cache on a scaled-down key space. Every
insert or touch the main cache sees is one access for the shadows. After each epoch
(one turnover: C accesses, at least `min_epoch`), the candidate with the most shadow
hits (exponentially averaged over epochs) becomes the main rule if it leads the current
one by more than the `switch_margin` (5%) and by more than `switch_sigmas` (2) standard
deviations of the hit counts (treated as Poisson), in `confirm_epochs` (3) epochs in a
row (the leader may change between those epochs: near-tied leaders do not restart the
count), so near-ties and passing phases cause no churn (a switch costs hits while the cache
re-forms); scores are averaged with weight `smoothing` (0.8) on the past. The first
candidate, `lru`, is the safe default: as soon as its shadow leads the current rule by
more than the noise, the policy falls back to it without waiting. Switching re-scores
every key once, 16 keys per later operation (no stall; victims mix both orders until the
pass ends), at most once per epoch. It starts as `lru`.

The capacity is not configured: it is read as the number of tracked keys whenever
`pop_victims` is called (the owner evicts when the cache is full); the shadows start
then, since nothing needs choosing before the first eviction. Ticks are ignored.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .chainheap import SEQ_BITS, SLOT_BITS, ChainHeapPolicy
from ._ghost import Ghost, probe
from .marconi import float_order_bits
from .policy import register_policy, reject_unknown_options

__all__ = ["DEFAULT_CANDIDATES", "AutoPolicy", "Candidate", "CandidatePolicy"]

RESCORE_STEP = 16
"""Keys re-scored per operation after a rule switch."""
_SEQ_MASK = (1 << SEQ_BITS) - 1
_SLOT_MASK = (1 << SLOT_BITS) - 1
_HASH_MULT = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


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

    def log_key(self, uses: int, depth: int, last_use: int, capacity: int) -> float:
        """The rule's log-space key (lower is evicted first)."""
        if self.reuse == "recency":
            return 0.0
        reuse = math.log(uses) if self.reuse == "linear" else math.log(math.log1p(uses))
        decay = self.decay_per_turnover / max(capacity, 1)
        return reuse - self.depth_weight * math.log1p(depth) + decay * last_use


DEFAULT_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("lru", reuse="recency"),
    Candidate("lfu-decay-0.25", reuse="linear", decay_per_turnover=0.25),
    Candidate("lfu-decay-1", reuse="linear", decay_per_turnover=1.0),
    Candidate("lfu-decay-4", reuse="linear", decay_per_turnover=4.0),
    Candidate("marconi-decay-0.25", reuse="linear", depth_weight=1.0, decay_per_turnover=0.25),
    Candidate("marconi-decay-1", reuse="linear", depth_weight=1.0, decay_per_turnover=1.0),
    Candidate("marconi-decay-4", reuse="linear", depth_weight=1.0, decay_per_turnover=4.0),
    Candidate("log-decay-1", reuse="log", decay_per_turnover=1.0),
    Candidate("doorkeeper-lru", reuse="recency", doorkeeper=True),
    Candidate("doorkeeper-lfu-decay-1", decay_per_turnover=1.0, doorkeeper=True),
)

GHOST_TURNOVERS = 4
"""The doorkeeper's memory: keys evicted within the last 4 to 8 capacities' worth of
evictions count as seen before (16 bytes per tracked key, see `_ghost.py`)."""
_PROBATION = -1 << SEQ_BITS
"""Priority base of a doorkeeper's first-time block: below every other rule's priority."""


class CandidatePolicy(ChainHeapPolicy):
    """Keys ordered by one `Candidate` rule; the base of `auto` and of its shadows."""

    name = "candidate"

    def __init__(self, candidate: Candidate, capacity: int = 0) -> None:
        super().__init__()
        self.candidate = candidate
        self.capacity = capacity
        """Capacity C used by the decay; 0 until known."""
        self.clock = 0
        """Inserted blocks so far: the age unit."""
        self.ghost: Ghost | None = None
        """Recently evicted keys, while a doorkeeper needs them (`set_ghost`)."""
        self._uses = array("I")
        self._depth = array("I")
        self._last = array("q")
        self._first_time = bytearray()

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

    def pop_victims(self, n: int) -> list[Hashable]:
        victims = super().pop_victims(n)
        ghost = self.ghost
        if ghost is not None:
            for key in victims:
                ghost.add(key)
        return victims

    def remove(self, key: Hashable) -> None:
        super().remove(key)
        if self.ghost is not None:
            self.ghost.add(key)

    def _priority(self, slot: int, seq: int) -> int:
        candidate = self.candidate
        if candidate.doorkeeper and self._first_time[slot]:
            return _PROBATION | seq
        if candidate.reuse == "recency":
            return seq
        key = self.candidate.log_key(
            self._uses[slot], self._depth[slot], self._last[slot], self.capacity
        )
        return (float_order_bits(key) << SEQ_BITS) | seq

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        self.clock += 1
        if self.candidate.doorkeeper:
            ghost = self.ghost
            parent = self._parent[slot]
            if ghost is None or (parent >= 0 and self._first_time[parent]):
                # a block whose prefix is new is new: its hash covers the prefix, and a
                # child leaves the cache (and enters the ghost) before its parent
                self._first_time[slot] = 1
            else:  # the doorkeeper's per-insert cost: one ghost probe
                seen = probe(ghost.generations, ghost.size, self._keys[slot])
                self._first_time[slot] = not seen
        else:
            self._first_time[slot] = 0  # not looked up: ordered as seen before
        self._uses[slot] = 1
        self._depth[slot] = depth
        self._last[slot] = self.clock
        return self._priority(slot, seq)

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        self._first_time[slot] = 0
        uses = self._uses[slot]
        if uses < 0xFFFFFFFF:
            self._uses[slot] = uses + 1
        self._last[slot] = self.clock
        return self._priority(slot, seq)

    def rescore(self, candidate: Candidate, capacity: int) -> None:
        """Switch rule and/or capacity: re-key every tracked key, keeping recency ties."""
        self.candidate = candidate
        self.capacity = capacity
        index = self._index
        for key, item in index.items():
            slot = item & _SLOT_MASK
            seq = (item >> SLOT_BITS) & _SEQ_MASK
            index[key] = (self._priority(slot, seq) << SLOT_BITS) | slot
        self._compact()


class _Shadow:
    """A miniature simulation of one candidate on the sampled keys.

    With every key sampled (small caches) it counts prefix hits the way the owner sees
    them: a hit on a key whose parent missed in this shadow does not count, because a
    prefix lookup would have stopped at the parent.
    """

    __slots__ = ("cache", "hits", "last_hit", "score")

    def __init__(self, candidate: Candidate) -> None:
        self.cache = CandidatePolicy(candidate)
        self.hits = 0
        self.score = 0.0
        self.last_hit: Hashable | None = None

    def access(
        self, key: Hashable, parent: Hashable | None, depth: int, limit: int, chained: bool
    ) -> None:
        cache = self.cache
        if key in cache:
            cache.touch(key)
            if not chained or parent is None or parent == self.last_hit:
                self.hits += 1
                self.last_hit = key
            return
        cache.insert(key, parent if chained else None, depth)
        if limit and len(cache) > limit:
            cache.pop_victims(len(cache) - limit)


class AutoPolicy(CandidatePolicy):
    """Self-tuning: switches between candidate rules by shadow-cache hit counts."""

    name = "auto"

    def __init__(
        self,
        *,
        candidates: Sequence[Candidate] = DEFAULT_CANDIDATES,
        sample_entries: int = 2048,
        min_epoch: int = 4096,
        switch_margin: float = 0.05,
        switch_sigmas: float = 2.0,
        confirm_epochs: int = 3,
        smoothing: float = 0.8,
    ) -> None:
        if not candidates:
            raise ValueError("option 'candidates' must name at least one Candidate")
        super().__init__(candidates[0])
        self.candidates = tuple(candidates)
        self.sample_entries = sample_entries
        self.min_epoch = min_epoch
        self.switch_margin = switch_margin
        self.switch_sigmas = switch_sigmas
        self.confirm_epochs = confirm_epochs
        self._leader = 0
        self._lead_epochs = 0
        self.smoothing = smoothing
        self._shadows = [_Shadow(c) for c in self.candidates]
        self._current = 0
        self._shift = 0  # sampling rate R = 2**-shift
        self._accesses = 0
        self._epoch_length = min_epoch
        self._switches = 0
        self._epochs = 0
        self._rescore_next = 0
        self._rescore_end = 0

    # --- what the owner calls --------------------------------------------------------

    def insert(self, key: Hashable, parent: Hashable | None = None, depth: int = 0) -> None:
        super().insert(key, parent, depth)
        if self.capacity:  # the shadows start once the capacity is known
            self._observe(key)
        if self._rescore_next < self._rescore_end:
            self._rescore_step()

    def touch(self, key: Hashable) -> None:
        super().touch(key)
        if self.capacity:
            self._observe(key)
        if self._rescore_next < self._rescore_end:
            self._rescore_step()

    def pop_victims(self, n: int) -> list[Hashable]:
        size = len(self)
        if size > self.capacity * 1.25 or size < self.capacity * 0.8:
            self._resize(size)
        if self._rescore_next < self._rescore_end:
            self._rescore_step()
        return super().pop_victims(n)

    def start_rescore(self, candidate: Candidate, capacity: int) -> None:
        """Switch rule and/or capacity; existing keys are re-keyed a few per operation.

        New inserts and touches use the new rule at once; the keys already tracked are
        re-scored `RESCORE_STEP` per operation (insert, touch or pop), so a switch never
        stalls the owner. Until the pass ends, victims mix both rules' orders.
        """
        self.candidate = candidate
        self.capacity = capacity
        self._rescore_next = 0
        self._rescore_end = len(self._keys)

    def finish_rescore(self) -> int:
        """Run a pending re-scoring pass (`start_rescore`) to its end now; its step count."""
        steps = 0
        while self._rescore_next < self._rescore_end:
            self._rescore_step()
            steps += 1
        return steps

    def _rescore_step(self) -> None:
        index = self._index
        keys = self._keys
        children = self._children
        pins = self._pins
        heap = self._heap
        # keys stored before a switch to a doorkeeper were not looked up: do it now (a
        # key that is cached and remembered as evicted was stored again after eviction)
        ghost = self.ghost if self.candidate.doorkeeper else None
        uses = self._uses
        first_time = self._first_time
        stop = min(self._rescore_next + RESCORE_STEP, self._rescore_end)
        for slot in range(self._rescore_next, stop):
            key = keys[slot]
            item = index.get(key)
            if item is None or item & _SLOT_MASK != slot:
                continue  # a free slot or a removed parent
            if ghost is not None and uses[slot] == 1:
                first_time[slot] = key not in ghost
            seq = (item >> SLOT_BITS) & _SEQ_MASK
            new = (self._priority(slot, seq) << SLOT_BITS) | slot
            if new == item:
                continue  # touched or inserted since the switch: already current
            item = new
            index[key] = item
            if children[slot] or pins[slot]:
                self._in_heap[slot] = 0
            else:
                heapq.heappush(heap, item)
                self._in_heap[slot] = 1
        self._rescore_next = stop
        self._maybe_compact()

    @property
    def current(self) -> Candidate:
        """The rule the main cache uses now."""
        return self.candidates[self._current]

    @property
    def switches(self) -> int:
        """How many times the rule changed."""
        return self._switches

    def shadow_scores(self) -> dict[str, float]:
        """Averaged shadow hits per candidate (what the next switch is decided on)."""
        return {s.cache.candidate.name: s.score for s in self._shadows}

    # --- tuning ----------------------------------------------------------------------

    def _observe(self, key: Hashable) -> None:
        shift = self._shift
        if shift == 0 or not ((hash(key) * _HASH_MULT) & _MASK64) >> (64 - shift):
            slot = self._index[key] & _SLOT_MASK
            pslot = self._parent[slot]
            parent = self._keys[pslot] if pslot >= 0 else None
            depth = self._depth[slot]
            limit = self.capacity >> shift
            chained = shift == 0
            clock = self.clock
            for shadow in self._shadows:
                shadow.cache.clock = clock
                shadow.access(key, parent, depth, limit, chained)
        self._accesses += 1
        if self._accesses >= self._epoch_length:
            self._end_epoch()

    def _sampled(self, key: Hashable, shift: int) -> bool:
        return shift == 0 or not ((hash(key) * _HASH_MULT) & _MASK64) >> (64 - shift)

    def _set_shift(self, shift: int) -> None:
        """Lower the sampling rate to 2**-shift, dropping keys that left the sample."""
        self._shift = shift
        for shadow in self._shadows:
            cache = shadow.cache
            for key in [k for k in cache._index if not self._sampled(k, shift)]:
                cache.remove(key)

    def _resize(self, capacity: int) -> None:
        shift = 0
        while (capacity >> shift) > self.sample_entries:
            shift += 1
        if shift > self._shift:
            self._set_shift(shift)
        elif shift < self._shift:
            self._shift = shift  # the sample grows back as new keys arrive
        self._epoch_length = max(capacity, self.min_epoch)
        if self.current.reuse == "recency":
            self.capacity = capacity  # LRU keys do not depend on the capacity
        else:
            self.start_rescore(self.current, capacity)
        if self.ghost is not None:
            self.set_ghost(capacity)
        limit = capacity >> self._shift
        for shadow in self._shadows:
            if shadow.cache.candidate.doorkeeper:
                shadow.cache.set_ghost(max(limit, 1))
            shadow.cache.rescore(shadow.cache.candidate, capacity)
            if len(shadow.cache) > limit:
                shadow.cache.pop_victims(len(shadow.cache) - limit)

    def _end_epoch(self) -> None:
        self._accesses = 0
        self._epochs += 1
        keep = self.smoothing
        for shadow in self._shadows:
            shadow.score = keep * shadow.score + (1.0 - keep) * shadow.hits
            shadow.hits = 0
        scores = [s.score for s in self._shadows]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        lead = scores[best] - scores[self._current]
        # hit counts are roughly Poisson: a lead inside `switch_sigmas` deviations is noise
        noise = self.switch_sigmas * math.sqrt(scores[best] + scores[self._current])
        current = scores[self._current]
        if self._current != 0 and scores[0] - current > self.switch_sigmas * math.sqrt(
            scores[0] + current
        ):
            self._switch(0)  # behind the safe default (candidate 0, LRU): fall back at once
            return
        if best == self._current or lead <= max(self.switch_margin * current, noise):
            self._lead_epochs = 0
            self._update_ghost()
            return
        # epochs in a row in which some candidate beat the current rule; near-tied
        # leaders (say, two doorkeeper rules) do not restart the count
        self._lead_epochs += 1
        self._leader = best
        if self._lead_epochs >= self.confirm_epochs:
            self._switch(best)
        else:
            self._update_ghost()

    def _update_ghost(self) -> None:
        """Start the ghost of evicted keys once a doorkeeper leads or is current.

        Starting it when a doorkeeper first leads gives it the confirmation epochs (one
        turnover each) to fill before a switch, and it is kept through lapses of the lead
        (a cold ghost makes every returning block look new); it is dropped when the policy
        switches from a doorkeeper to a rule without one. Until then evictions cost nothing
        extra.
        """
        leading = self._lead_epochs > 0 and self.candidates[self._leader].doorkeeper
        if (self.current.doorkeeper or leading) and self.ghost is None:
            self.set_ghost(self.capacity)

    def _switch(self, index: int) -> None:
        if self.current.doorkeeper and not self.candidates[index].doorkeeper:
            self.ghost = None
        self._current = index
        self._lead_epochs = 0
        self._switches += 1
        self._update_ghost()
        self.start_rescore(self.current, self.capacity)


def _build(**options: Any) -> AutoPolicy:
    accepted = (
        "sample_entries",
        "min_epoch",
        "switch_margin",
        "switch_sigmas",
        "confirm_epochs",
        "smoothing",
    )
    reject_unknown_options("auto", options, accepted)
    for name in ("sample_entries", "min_epoch", "confirm_epochs"):
        value = options.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"option {name!r} must be an int >= 1; got {value!r}")
    sigmas = options.get("switch_sigmas", 0.0)
    if isinstance(sigmas, bool) or not isinstance(sigmas, int | float) or sigmas < 0:
        raise ValueError(f"option 'switch_sigmas' must be a number >= 0; got {sigmas!r}")
    for name in ("switch_margin", "smoothing"):
        value = options.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ValueError(f"option {name!r} must be a number in [0, 1); got {value!r}")
    return AutoPolicy(**options)


register_policy("auto", _build)
