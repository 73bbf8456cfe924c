"""The scheduler side's lookups in vLLM's terms, shared by the tier and the direct manager.

`SchedulerLookup` owns the `.lookup.BatchedLookup` and the `.metrics.TierMetrics` of one
manager: it turns answers into vLLM's `LookupResult` (counting each final one), sends a
round at the end of each scheduler step, and reports the rounds and the store's member
transitions with the step's stats.

No spinning: while a request waits on us (a round in flight, a load pending), vLLM keeps
stepping with nothing to run, and each empty step ends here again within microseconds.
Such a step waits up to `IDLE_WAIT_S` for the round or a load to finish instead, so a
pending lookup costs a few wake-ups per second, not a busy core. A step that ran a forward
pass comes back later than `SPIN_GAP_S` and never waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import _compat as c
from .lookup import Answer, BatchedLookup
from .metrics import LOOKUP_ROUNDS, TierMetrics

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import LookupResult

    from .store import MemberState

__all__ = ["IDLE_WAIT_S", "SPIN_GAP_S", "SchedulerLookup"]

SPIN_GAP_S = 0.001
"""Two step ends closer than this ran no forward pass in between (the engine spins)."""
IDLE_WAIT_S = 0.01
"""The longest an empty step waits for a round or a load to finish."""

_RESULT = {
    Answer.HIT: c.LookupResult.HIT,
    Answer.MISS: c.LookupResult.MISS,
    Answer.PENDING: c.LookupResult.RETRY,
}


class SchedulerLookup:
    """One manager's lookups and metrics; every method runs on the scheduler thread.

    `progress` is set by the lookup's rounds and the manager's jobs when one ends;
    `waiting` says whether a request waits on the manager besides the lookup round;
    `health` reports the store's members.
    """

    def __init__(
        self,
        lookup: BatchedLookup,
        metrics: TierMetrics,
        progress: threading.Event,
        health: Callable[[], list[MemberState]],
        waiting: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.batched = lookup
        self.metrics = metrics
        self._progress = progress
        self._health = health
        self._waiting = waiting
        self._clock = clock
        self._last_end = -1.0
        self._rounds_reported = 0

    def result(self, answer: Answer) -> LookupResult:
        """vLLM's `LookupResult` for `answer` (PENDING is RETRY), counted once final."""
        self.metrics.count_lookup(answer)
        return _RESULT[answer]

    def on_schedule_end(self) -> None:
        """Send one `exists` round for the keys this step asked about; in an empty step
        while a request waits on us, first wait (briefly) for something to finish."""
        spinning = self._clock() - self._last_end < SPIN_GAP_S
        self._progress.clear()
        self.batched.flush()
        if spinning and (self.batched.pending() or self._waiting()):
            self._progress.wait(IDLE_WAIT_S)
        self._last_end = self._clock()

    def pending(self) -> bool:
        """Whether a round is queued or in flight (sending a queued one first)."""
        self.batched.flush()
        return self.batched.pending()

    def take_stats(self) -> OffloadingConnectorStats | None:
        """The metrics since the last call, with the rounds sent and the members' down/up
        transitions since then."""
        rounds = self.batched.rounds
        self.metrics.inc(LOOKUP_ROUNDS, rounds - self._rounds_reported)
        self._rounds_reported = rounds
        self.metrics.count_health(self._health())
        return self.metrics.take()

    def close(self) -> None:
        self.batched.close()
