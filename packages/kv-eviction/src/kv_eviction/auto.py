"""`auto`: a policy that picks its own rule by miniature simulation.

The main cache orders keys by one `Candidate` rule at a time (`candidate.py`: LRU,
frequency and Marconi-shaped rules with a decay per cache turnover, doorkeepers and a
probation window). Alongside, each candidate runs a miniature simulation (Waldspurger et
al., "Cache Modeling and Optimization using Miniature Simulations", USENIX ATC '17; the
spatially hashed sampling of SHARDS, Waldspurger et al., FAST '15): a shadow cache that
sees only the keys whose hash falls in a sample of rate R and holds R x C keys, so it
behaves like the full-size cache on a scaled-down key space. Every insert or touch the
main cache sees is one access for the shadows.

**Bounded cost.** R is `sample_budget` / K for K candidates, halved until a shadow holds
at most `sample_entries` keys (R x C <= `sample_entries`; halving, so a growing cache
re-filters its shadows only when it doubles): an access costs the main cache's work plus,
on average, at most `sample_budget` shadow accesses, at every size. Sampled accesses are
queued and replayed by every shadow `BATCH` at a time (`_shadow.py`).

**Paired comparison.** All shadows see the same sampled accesses, so each is compared
with the current rule's shadow access by access: it *wins* an access it hits and the
current rule misses, and *loses* the opposite (McNemar's test). After each epoch (a
quarter turnover: C / 4 accesses, at least `min_epoch`), wins minus losses and wins plus
losses are averaged over epochs with weight `smoothing` (0.9) on the past; a candidate
leads when its averaged lead exceeds `switch_sigmas` (3) standard deviations of that
average (a Poisson count of discordant accesses, shrunk by the averaging) and
`switch_margin` (2%) of the current rule's averaged hits, and rests on at least
`min_discordant` (25) discordant accesses (the validity condition of the normal
approximation). Shadows of fewer than `min_shadow_keys` (32) keys are too coarse to stand
for the cache and decide nothing, so below 32 / R blocks (320 with the default
candidates) `auto` is LRU. The leader becomes the main rule after leading
`confirm_epochs` (1) epochs in a row (the leader may change between those epochs); at
3 sigmas a tie passes the test in about 0.5% of epochs for four challengers, so passing
phases cause little churn (a switch costs hits while the cache re-forms). The first
candidate, `lru`, is the safe default: as soon as it leads the current rule, the policy
falls back to it. A switch re-keys the tracked keys `RESCORE_STEP` per later operation
(no stall; victims mix both orders until the pass ends, within C / 2 operations). The
shadows start with the first insert (unbounded until the first eviction tells the
capacity), so they are warm when the first decision is due.

**Cold start.** Until the first hit, no rule can be told from another, but evictions
still decide what the cache holds when reuse begins. Over that stretch the main cache
uses the first depth-weighted candidate (the Marconi shape): it keeps the first blocks of
every prefix, which serve sessions that come back in any order, where LRU keeps only the
latest (nothing, when sessions come back in a cycle longer than the cache). The first hit
ends the cold start (noticed at the next shadow replay or eviction): if nothing was
evicted yet, every rule would hold the same keys, and the policy becomes `lru` at no cost;
otherwise the shadows decide from there, as after any switch. Below 32 / R blocks, where
they cannot, the cold start ends at the first eviction, in `lru`.

A doorkeeper rule needs a ghost of evicted keys; the main cache keeps one from the first
epoch in which a doorkeeper leads until it switches to a rule without one, and looks a
stored key up only while a doorkeeper rule is current; after a switch to one, the
re-keying pass looks up the keys stored before it that were never hit.

The capacity is not configured: it is read as the number of tracked keys whenever
`pop_victims` is called (the owner evicts when the cache is full). Ticks are ignored.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Sequence
from typing import Any

from ._ghost import probe
from ._shadow import Access, Shadow
from .candidate import (
    DOORKEEPER_LFU,
    DOORKEEPER_LRU,
    LRU,
    PROBATION_BASE,
    PROBATION_LRU,
    SEQ_MASK,
    Candidate,
    CandidatePolicy,
)
from .chainheap import COMPACT_FACTOR, COMPACT_SLACK, SLOT_BITS, SLOT_MASK, ChainHeapPolicy
from .policy import reject_unknown_options
from .retention import Retention

__all__ = ["DEFAULT_CANDIDATES", "MARCONI_SHAPE", "AutoPolicy", "Candidate", "CandidatePolicy"]

BATCH = 64
"""Sampled accesses queued before the shadows replay them (one call per shadow per batch)."""
RESCORE_STEP = 2
"""Keys re-scored per operation after a rule switch: a pass over C keys ends within C / 2
operations, before the next epoch can switch again."""
EPOCH_TURNOVERS = 0.25
"""Epoch length in cache turnovers (at least `min_epoch` accesses): decisions come four
times per turnover, on leads averaged over about five epochs."""
_HASH_MULT = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_HASH_SPACE = 1 << 64

MARCONI_SHAPE = Candidate("marconi-shape", reuse="linear", depth_weight=1.0)
"""Use count over prefix depth + 1, no decay: the seed's Marconi rule. Where sessions come
back in a cycle longer than the cache, every recency rule keeps nothing; this one keeps
the first blocks of every session."""

DEFAULT_CANDIDATES: tuple[Candidate, ...] = (
    LRU,
    MARCONI_SHAPE,
    DOORKEEPER_LRU,
    DOORKEEPER_LFU,
    PROBATION_LRU,
)
"""Five rules, one of each kind: every shadow costs a share of the sampling budget, and the
share per candidate decides how fast a better rule is found, so near-duplicates (decays
0.25, 1 and 4, log reuse) were dropped."""


class AutoPolicy(CandidatePolicy):
    """Self-tuning: switches between candidate rules by shadow-cache hit counts."""

    # see ChainHeapPolicy's slots: auto has about 60 attributes
    __slots__ = (
        "_budget_rate",
        "_cold",
        "_compared",
        "_current",
        "_due",
        "_epoch_length",
        "_epoch_start",
        "_epochs",
        "_lead_epochs",
        "_leader",
        "_pending",
        "_rate",
        "_rescore_end",
        "_rescore_next",
        "_shadows",
        "_switches",
        "_threshold",
        "candidates",
        "confirm_epochs",
        "min_discordant",
        "min_epoch",
        "min_shadow_keys",
        "sample_budget",
        "sample_entries",
        "smoothing",
        "switch_margin",
        "switch_sigmas",
    )

    name = "auto"

    def __init__(
        self,
        *,
        candidates: Sequence[Candidate] = DEFAULT_CANDIDATES,
        sample_entries: int = 2048,
        sample_budget: float = 0.5,
        min_epoch: int = 4096,
        switch_margin: float = 0.02,
        switch_sigmas: float = 3.0,
        confirm_epochs: int = 1,
        smoothing: float = 0.9,
        min_shadow_keys: int = 32,
        min_discordant: int = 25,
    ) -> None:
        if not candidates:
            raise ValueError("option 'candidates' must name at least one Candidate")
        super().__init__(candidates[0])
        self.candidates = tuple(candidates)
        self.sample_entries = sample_entries
        self.sample_budget = sample_budget
        self.min_epoch = min_epoch
        self.switch_margin = switch_margin
        self.switch_sigmas = switch_sigmas
        self.confirm_epochs = confirm_epochs
        self.smoothing = smoothing
        self.min_shadow_keys = min_shadow_keys
        self.min_discordant = min_discordant
        """Discordant accesses (one shadow hits, the other misses) a lead must rest on:
        25 is the textbook validity condition of McNemar's normal approximation."""
        self._leader = 0
        self._lead_epochs = 0
        self._shadows = [Shadow(c) for c in self.candidates]
        self._pending: list[Access] = []
        self._current = 0
        self._budget_rate = min(1.0, sample_budget / len(self.candidates))
        self._rate = self._budget_rate  # the sampling rate R
        self._threshold = int(self._rate * _HASH_SPACE)
        """A key is sampled when its 64-bit multiplicative hash is below this."""
        self._epoch_start = 0
        """`_seq` (which counts inserts and touches, the shadows' accesses) when the epoch
        began."""
        self._epoch_length = min_epoch
        self._switches = 0
        self._epochs = 0
        self._compared = 0
        """Epochs averaged into the leads since they were last reset (at a switch)."""
        self._rescore_next = 0
        self._rescore_end = 0
        self._cold = _cold_start_rule(self.candidates)
        """The rule used until the first hit (0: none, the policy starts as `lru`)."""
        if self._cold:
            self._current = self._cold
            self._set_rule(self.current, 0)
        self._due = self._epoch_length
        """`_seq` at which `_due_work` runs next: the epoch's end, or at once while a
        re-scoring pass is pending."""

    # --- what the owner calls --------------------------------------------------------

    def _accessed(self, slot: int) -> None:
        # every insert and touch ends here (no wrapper around them: a call layer per
        # access was a tenth of auto's time on the step benchmark's calls)
        if len(self._heap) > COMPACT_FACTOR * len(self._index) + COMPACT_SLACK:
            self._compact()  # `_maybe_compact` written out
        key = self._keys[slot]
        if (hash(key) * _HASH_MULT) & _MASK64 < self._threshold:
            self._pending.append((key, self._depth[slot], self.clock))
            if len(self._pending) >= BATCH:
                self._replay()
        if self._seq >= self._due:
            self._due_work()

    def pop_victims(self, n: int) -> list[Hashable]:
        size = len(self._index)
        if size > self._resize_above or size < self._resize_below:
            self._resize(size)
        if self._cold and (self._touches or self._coarse()):
            self._end_cold_start()
        if self._rescore_next < self._rescore_end:
            self._rescore_step()
        victims = ChainHeapPolicy.pop_victims(self, n)  # one call layer fewer than super()
        if self.ghost is not None:
            self._remember(victims)
        return victims

    def _due_work(self) -> None:
        if self._rescore_next < self._rescore_end:
            self._rescore_step()
        if self._seq - self._epoch_start >= self._epoch_length:
            self._epoch_done()
        self._set_due()

    def _set_due(self) -> None:
        """Due work at once while a re-scoring pass is pending, else at the epoch's end."""
        pending = self._rescore_next < self._rescore_end
        self._due = 0 if pending else self._epoch_start + self._epoch_length

    def _end_cold_start(self) -> None:
        """After the first hit (seen at the next shadow replay or eviction, so that no
        access pays for the check), or at the first eviction of a cache too small for the
        shadows: `lru` if nothing was evicted yet (every rule holds the same keys) or the
        shadows are too coarse to decide; else the cold rule stays."""
        self._cold = 0
        if not self._evictions or self._coarse():
            self._current = 0
            self.start_rescore(self.current, self.capacity)
            if not self._evictions:
                self.finish_rescore()  # the first victims come in LRU's order

    def _coarse(self) -> bool:
        """Whether the shadows hold too few keys to stand for the cache."""
        return self._shadows[0].limit < self.min_shadow_keys

    def start_rescore(self, candidate: Candidate, capacity: int) -> None:
        """Switch rule and/or capacity; existing keys are re-keyed a few per operation.

        New inserts and touches use the new rule at once; the keys already tracked are
        re-scored `RESCORE_STEP` per operation (insert, touch or pop), so a switch never
        stalls the owner. Until the pass ends, victims mix both rules' orders.
        """
        self._cold = 0  # the rule is chosen now
        self._rekey(candidate, capacity)

    def _rekey(self, candidate: Candidate, capacity: int) -> None:
        self._set_rule(candidate, capacity)
        self._rescore_next = 0
        self._rescore_end = len(self._keys)
        self._due = 0

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
        # keys stored before a switch to a doorkeeper were not looked up: do it now (a
        # key that is cached and remembered as evicted was stored again after eviction)
        ghost = self.ghost if self._doorkeeper else None
        generations, size = (ghost.generations, ghost.size) if ghost else ([], 0)
        uses = self._uses
        first_time = self._first_time
        # a recency rule's priority written out (`_priority`): a call per key was a
        # third of a pass
        recency, doorkeeper = self._recency, self._doorkeeper
        retention = self._retention
        stop = min(self._rescore_next + RESCORE_STEP, self._rescore_end)
        for slot in range(self._rescore_next, stop):
            key = keys[slot]
            item = index.get(key)
            if item is None or item & SLOT_MASK != slot:
                continue  # a free slot or a removed parent
            if ghost is not None and uses[slot] == 1:
                first_time[slot] = not probe(generations, size, key)
            seq = (item >> SLOT_BITS) & SEQ_MASK
            if not recency:
                priority = self._priority(slot, seq)
            elif doorkeeper and first_time[slot]:
                priority = PROBATION_BASE | seq
            else:
                priority = seq
            if retention[slot] != Retention.NORMAL:
                priority += self._retention_offset(slot)
            new = (priority << SLOT_BITS) | slot
            if new == item:
                continue  # touched or inserted since the switch: already current
            item = new
            index[key] = item
            if children[slot] or pins[slot]:
                self._in_heap[slot] = 0
            else:
                heapq.heappush(self._side if item < 0 else self._heap, item)
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

    @property
    def sample_rate(self) -> float:
        """The shadows' share of the key space, R."""
        return self._rate

    def shadow_scores(self) -> dict[str, float]:
        """Averaged shadow hits per candidate."""
        return {s.candidate.name: s.score for s in self._shadows}

    # --- tuning ----------------------------------------------------------------------

    def _replay(self) -> None:
        """Every shadow replays the queued sampled accesses; wins and losses against the
        current rule's shadow, access by access (bit i of a hit mask is access i)."""
        if self._cold and self._touches:
            self._end_cold_start()
        batch = self._pending
        if not batch:
            return
        self._pending = []
        shadows = self._shadows
        masks = [shadow.replay(batch) for shadow in shadows]
        current = masks[self._current]
        for shadow, hits in zip(shadows, masks, strict=True):
            shadow.hits += hits.bit_count()
            shadow.wins += (hits & ~current).bit_count()
            shadow.losses += (current & ~hits).bit_count()

    def _epoch_done(self) -> None:
        self._replay()
        if self.capacity:
            self._end_epoch()
        else:  # still filling: keep the sample within `sample_entries` keys
            self._epoch_start = self._seq
            self._set_rate(len(self))

    def _sampled(self, key: Hashable) -> bool:
        return (hash(key) * _HASH_MULT) & _MASK64 < self._threshold

    def _set_rate(self, size: int) -> None:
        """The sampling rate for `size` keys; shadows drop the keys that left the sample."""
        rate = self._budget_rate
        while size * rate > self.sample_entries:
            rate /= 2  # halving, so a growing cache re-filters its shadows at doublings only
        lowered = rate < self._rate
        self._replay()  # queued accesses were sampled at the old rate
        self._rate = rate  # a higher rate refills as new keys arrive
        self._threshold = int(rate * _HASH_SPACE)
        if lowered:  # the keys below the new threshold are a subset of the old sample
            for shadow in self._shadows:
                shadow.resize(shadow.limit, shadow.capacity, self._sampled)

    def _resize(self, capacity: int) -> None:
        self._set_rate(capacity)
        self._epoch_length = max(int(capacity * EPOCH_TURNOVERS), self.min_epoch)
        if not self.current.keyed_by_capacity or self.capacity:
            # keys without a decay (LRU, the cold start's Marconi shape) do not depend on
            # the capacity; after the first reading, keys keep the decay of the old
            # capacity until touched (at most 25% off): no O(n) pass
            self._set_rule(self.candidate, capacity)
        else:
            self._rekey(self.current, capacity)  # the cold start, if on, goes on
        if self.ghost is not None:
            self.set_ghost(capacity)
        limit = max(1, int(capacity * self._rate))
        for shadow in self._shadows:
            shadow.resize(limit, capacity)
        self._set_due()

    def _leads(self, index: int) -> bool:
        """Whether candidate `index` beats the current rule beyond noise and margin."""
        shadow = self._shadows[index]
        keep = self.smoothing
        # per epoch, wins - losses has variance wins + losses under a tie (McNemar); an
        # exponential average over n epochs (counted from zero) has variance
        # (1 - keep) (1 + keep**n) / (1 + keep) times that of one epoch over its mean
        shrink = (1.0 - keep) * (1.0 + keep**self._compared) / (1.0 + keep)
        noise = self.switch_sigmas * math.sqrt(shadow.discord * shrink)
        margin = self.switch_margin * self._shadows[self._current].score
        coarse = self._coarse()
        # discord / shrink is the number of discordant accesses the average stands for;
        # below `min_discordant` the normal approximation of McNemar's test does not hold
        few = shadow.discord < self.min_discordant * shrink
        lead = shadow.lead > max(noise, margin)
        return index != self._current and not coarse and not few and lead

    def _end_epoch(self) -> None:
        self._epoch_start = self._seq
        self._epochs += 1
        self._compared += 1
        for shadow in self._shadows:
            shadow.end_epoch(self.smoothing)
        if self._leads(0):
            self._switch(0)  # behind the safe default (candidate 0, LRU): fall back at once
            return
        best = max(range(len(self._shadows)), key=lambda i: (self._shadows[i].lead, -i))
        if not self._leads(best):
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

        Starting it when a doorkeeper first leads gives it the confirmation epochs (a
        quarter turnover each; none beyond the switch's own with `confirm_epochs` 1) to
        fill before a switch, and it is kept through lapses of the lead (a cold ghost makes
        every returning block look new); it is dropped when the policy switches from a
        doorkeeper to a rule without one. Until then evictions cost nothing extra.
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
        for shadow in self._shadows:  # leads were measured against the old rule
            shadow.lead = shadow.discord = 0.0
        self._compared = 0
        self._update_ghost()
        self.start_rescore(self.current, self.capacity)


def _cold_start_rule(candidates: Sequence[Candidate]) -> int:
    """Index of the first candidate after the first that weights prefix depth, else 0."""
    for index, candidate in enumerate(candidates[1:], start=1):
        if candidate.reuse != "recency" and candidate.depth_weight > 0:
            return index
    return 0


def build(**options: Any) -> AutoPolicy:
    accepted = (
        "sample_entries",
        "sample_budget",
        "min_epoch",
        "switch_margin",
        "switch_sigmas",
        "confirm_epochs",
        "smoothing",
        "min_shadow_keys",
        "min_discordant",
    )
    reject_unknown_options("auto", options, accepted)
    for name in ("sample_entries", "min_epoch", "confirm_epochs", "min_shadow_keys"):
        value = options.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"option {name!r} must be an int >= 1; got {value!r}")
    discordant = options.get("min_discordant", 0)
    if isinstance(discordant, bool) or not isinstance(discordant, int) or discordant < 0:
        raise ValueError(f"option 'min_discordant' must be an int >= 0; got {discordant!r}")
    sigmas = options.get("switch_sigmas", 0.0)
    if isinstance(sigmas, bool) or not isinstance(sigmas, int | float) or not sigmas >= 0:
        raise ValueError(f"option 'switch_sigmas' must be a number >= 0; got {sigmas!r}")
    budget = options.get("sample_budget", 0.5)
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0:
        raise ValueError(f"option 'sample_budget' must be a number > 0; got {budget!r}")
    for name in ("switch_margin", "smoothing"):
        value = options.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ValueError(f"option {name!r} must be a number in [0, 1); got {value!r}")
    return AutoPolicy(**options)
