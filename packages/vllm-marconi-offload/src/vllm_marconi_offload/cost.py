"""Should an L2 hit be loaded, or is recomputing those tokens cheaper?

A disk tier only pays off when reading a block is faster than prefilling its tokens; on a
slow disk with a fast GPU it is not. Both costs are measured online: prefill time per token
from the time between a step's start (or the previous step's report, whichever is later)
and the workers' report that they ran it, so an idle engine between steps never counts as
prefill; L2 read time per byte from the promotions the store completes, counting only
blocks read from the disk (a block the page cache may have served, written or read
moments before on an L2 without O_DIRECT, reads at memory speed and is left out). A
configured rate is an assumption that the first measurement replaces; later measurements
enter an exponentially weighted average of the time per unit (not of the rate, so fast
samples cannot hide slow ones). Until prefill has been measured, hits are loaded. A
skipped tier teaches the model nothing, so after `PROBE_AFTER_SKIPS` skips in a row part
of one hit is loaded anyway to measure the disk again; that probe costs at most
`PROBE_BUDGET` of the time recomputing the hit's L2 part takes, at the current estimates.
The runs that shaped these rules are in docs/benchmarks.md (*Why the connector's rules
look as they do*).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool_mmap import LoadTicket, Tier

SMOOTHING = 0.2
# Steps with fewer scheduled tokens say more about fixed per-step costs than about
# prefill throughput; they are left out of the estimate.
MIN_PREFILL_TOKENS = 256
PROBE_AFTER_SKIPS = 16
PROBE_BUDGET = 0.1
# Prefill steps started whose output has not been reported: one, or two under async
# scheduling; more only if reports are lost, and then the oldest are forgotten.
MAX_STEPS_IN_FLIGHT = 4


@dataclass
class _Cost:
    """Seconds per unit (0: unknown): assumed until the first sample, then averaged."""

    seconds_per_unit: float
    measured: bool = False

    @classmethod
    def assumed(cls, units_per_second: float) -> _Cost:
        return cls(1.0 / units_per_second if units_per_second > 0 else 0.0)

    def observe(self, units: float, seconds: float) -> None:
        if units <= 0 or seconds <= 0:
            return
        sample = seconds / units
        if not self.measured:
            self.seconds_per_unit, self.measured = sample, True
        else:
            self.seconds_per_unit += SMOOTHING * (sample - self.seconds_per_unit)

    @property
    def units_per_second(self) -> float:
        return 1.0 / self.seconds_per_unit if self.seconds_per_unit > 0 else 0.0


class LoadCostModel:
    """Online estimates of L2 read and prefill time, and the decision between them."""

    def __init__(
        self,
        *,
        l2_read_bytes_per_s: float,
        prefill_tokens_per_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._l2 = _Cost.assumed(l2_read_bytes_per_s)
        self._prefill = _Cost.assumed(prefill_tokens_per_s)
        self._clock = clock
        self._steps: dict[int, tuple[float, int]] = {}  # step -> (start, tokens)
        self._last_report = float("-inf")
        self._skips_in_a_row = 0

    def on_step(self, step: int, scheduled_tokens: int) -> None:
        """Step number `step` starts (its connector metadata is built) with these tokens."""
        if scheduled_tokens < MIN_PREFILL_TOKENS:
            return
        self._steps[step] = (self._clock(), scheduled_tokens)
        if len(self._steps) > MAX_STEPS_IN_FLIGHT:
            del self._steps[min(self._steps)]

    def on_step_done(self, step: int) -> None:
        """The workers reported that they ran step `step`: time its tokens (steps are
        numbered in order, so any older one still waiting lost its report).

        A step runs from the later of its start and the previous report: under async
        scheduling the next step is scheduled while the previous one still runs, and
        counting that overlap made a long prompt's later chunks look twice as slow.
        """
        now = self._clock()
        started = self._steps.pop(step, None)
        for older in [s for s in self._steps if s < step]:
            del self._steps[older]
        if started is not None:
            start, tokens = started
            self._prefill.observe(tokens, now - max(start, self._last_report))
        self._last_report = now

    def on_promotion(self, nbytes: int, seconds: float) -> None:
        """A promotion of `nbytes` from L2 finished `seconds` after it started."""
        self._l2.observe(nbytes, seconds)

    def on_promotions(self, tickets: Sequence[LoadTicket], slot_bytes: int) -> None:
        """One lookup's promotions finished: learn from its blocks read from the disk
        (`slot_bytes` each) over the time its slowest ticket took. Blocks the page cache
        may have served (`LoadTicket.cached_promotions`) are left out; if that leaves none,
        nothing is learned. Their share of the time is not, which errs towards a slower
        disk: the safe side, since a skipped load costs at most a recompute."""
        from_disk = sum(t.tiers.count(Tier.L2) - t.cached_promotions for t in tickets)
        seconds = max((t.promotion_seconds for t in tickets), default=0.0)
        if from_disk > 0:
            self.on_promotion(from_disk * slot_bytes, seconds)

    def blocks_to_load(self, blocks: int, l2_bytes: int, tokens: int) -> int:
        """How many of `blocks` hit blocks (holding `l2_bytes` in L2, covering `tokens`
        tokens) to load: all when reading is expected to beat recomputing, else none, or
        a probe's first few after `PROBE_AFTER_SKIPS` skips in a row."""
        if l2_bytes <= 0 or self._prefill.seconds_per_unit <= 0:
            return blocks
        load = l2_bytes * self._l2.seconds_per_unit
        recompute = tokens * self._prefill.seconds_per_unit
        if load < recompute:
            self._skips_in_a_row = 0
            return blocks
        if self._skips_in_a_row < PROBE_AFTER_SKIPS:
            self._skips_in_a_row += 1
            return 0
        self._skips_in_a_row = 0
        # Each probed block costs (load - recompute) / blocks more than recomputing it.
        affordable = PROBE_BUDGET * recompute / (load - recompute) * blocks
        return max(1, min(blocks, int(affordable)))

    @property
    def l2_bytes_per_s(self) -> float:
        return self._l2.units_per_second

    @property
    def prefill_tokens_per_s(self) -> float:
        return self._prefill.units_per_second
