"""The scheduler side's lookups in vLLM's terms, shared by the tier and the direct manager.

`SchedulerLookup` owns the `.lookup.BatchedLookup` and the `.metrics.TierMetrics` of one
manager: it turns answers into vLLM's `LookupResult` (counting each final one), sends a
round at the end of each scheduler step, and reports the rounds with the step's stats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _compat as c
from .lookup import Answer, BatchedLookup
from .metrics import LOOKUP_ROUNDS, TierMetrics

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import LookupResult

__all__ = ["SchedulerLookup"]

_RESULT = {
    Answer.HIT: c.LookupResult.HIT,
    Answer.MISS: c.LookupResult.MISS,
    Answer.PENDING: c.LookupResult.RETRY,
}


class SchedulerLookup:
    """One manager's lookups and metrics; every method runs on the scheduler thread."""

    def __init__(self, lookup: BatchedLookup, metrics: TierMetrics) -> None:
        self.batched = lookup
        self.metrics = metrics
        self._rounds_reported = 0

    def result(self, answer: Answer) -> LookupResult:
        """vLLM's `LookupResult` for `answer` (PENDING is RETRY), counted once final."""
        self.metrics.count_lookup(answer)
        return _RESULT[answer]

    def on_schedule_end(self) -> None:
        """Send one `exists` round for the keys this step asked about."""
        self.batched.flush()

    def pending(self) -> bool:
        """Whether a round is queued or in flight (sending a queued one first)."""
        self.batched.flush()
        return self.batched.pending()

    def take_stats(self) -> OffloadingConnectorStats | None:
        """The metrics since the last call, with the rounds sent since then."""
        rounds = self.batched.rounds
        self.metrics.inc(LOOKUP_ROUNDS, rounds - self._rounds_reported)
        self._rounds_reported = rounds
        return self.metrics.take()

    def close(self) -> None:
        self.batched.close()
