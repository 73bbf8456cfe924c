"""Should an L2 hit be loaded, or is recomputing those tokens cheaper?

A disk tier only pays off when reading a block is faster than prefilling its tokens: on a
slow disk with a fast GPU it is not (vLLM's own fs tier made a 32k-token TTFT up to 2.3x
slower than recomputing). Both rates are measured online, as exponentially weighted
averages: prefill throughput from the scheduler's step times, L2 read throughput from the
promotions the store completes. Until prefill has been measured, hits are loaded. A
skipped tier teaches the model nothing, so after `PROBE_AFTER_SKIPS` skips in a row one hit
is loaded anyway to measure the disk again (it may have been busy, or the page cache warm).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

SMOOTHING = 0.2
# Steps with fewer scheduled tokens say more about fixed per-step costs than about
# prefill throughput; they are left out of the estimate.
MIN_PREFILL_TOKENS = 256
PROBE_AFTER_SKIPS = 16


@dataclass
class _Rate:
    """An exponentially weighted average of units per second."""

    value: float

    def observe(self, units: float, seconds: float) -> None:
        if units <= 0 or seconds <= 0:
            return
        sample = units / seconds
        self.value = sample if self.value <= 0 else self.value + SMOOTHING * (sample - self.value)


class LoadCostModel:
    """Online estimates of L2 read and prefill throughput, and the decision between them."""

    def __init__(
        self,
        *,
        l2_read_bytes_per_s: float,
        prefill_tokens_per_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._l2 = _Rate(l2_read_bytes_per_s)
        self._prefill = _Rate(prefill_tokens_per_s)
        self._clock = clock
        self._last_step: float | None = None
        self._last_tokens = 0
        self._skips_in_a_row = 0

    def on_step(self, scheduled_tokens: int) -> None:
        """Called once per scheduler step: the time since the previous step ran its tokens."""
        now = self._clock()
        if self._last_step is not None and self._last_tokens >= MIN_PREFILL_TOKENS:
            self._prefill.observe(self._last_tokens, now - self._last_step)
        self._last_step, self._last_tokens = now, scheduled_tokens

    def on_promotion(self, nbytes: int, seconds: float) -> None:
        """A promotion of `nbytes` from L2 finished `seconds` after it started."""
        self._l2.observe(nbytes, seconds)

    def worth_loading(self, l2_bytes: int, tokens: int) -> bool:
        """True if reading `l2_bytes` from L2 is expected to beat recomputing `tokens`."""
        if l2_bytes <= 0 or self._prefill.value <= 0:
            return True
        load = l2_bytes / self._l2.value
        recompute = tokens / self._prefill.value
        if load < recompute or self._skips_in_a_row >= PROBE_AFTER_SKIPS:
            self._skips_in_a_row = 0
            return True
        self._skips_in_a_row += 1
        return False

    @property
    def l2_bytes_per_s(self) -> float:
        return self._l2.value

    @property
    def prefill_tokens_per_s(self) -> float:
        return self._prefill.value
