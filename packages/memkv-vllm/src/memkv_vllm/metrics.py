"""The tier's Prometheus metrics: names, definitions for vLLM, and a thread-safe recorder.

Transfer threads record into plain counters; `take()` (called from vLLM's
`get_stats` on the scheduler thread) turns the deltas into vLLM's stats object and
resets them. Counters show up in `/metrics` with a `_total` suffix.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from vllm_kv_identity.vocabulary import LATENCY_BUCKETS

from .lookup import Answer

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import OffloadingMetricMetadata

    from .store import MemberState

__all__ = ["METRICS", "TierMetrics", "metric_definitions"]

PREFIX = "vllm:kv_offload_memkv_"
STORE_BYTES = PREFIX + "store_bytes"
LOAD_BYTES = PREFIX + "load_bytes"
BLOCKS = PREFIX + "blocks"
JOB_SECONDS = PREFIX + "job_seconds"
JOBS_FAILED = PREFIX + "jobs_failed"
STORE_SHEDS = PREFIX + "store_sheds"
LOOKUPS = PREFIX + "lookups"
LOOKUP_ROUNDS = PREFIX + "lookup_rounds"
UNAVAILABLE = PREFIX + "unavailable_blocks"
MEMBER_DOWN = PREFIX + "member_down"
MEMBER_UP = PREFIX + "member_up"

# name -> (kind, documentation, label names)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    STORE_BYTES: ("counter", "Bytes stored from the CPU pool into MemKV.", ()),
    LOAD_BYTES: ("counter", "Bytes loaded from MemKV into the CPU pool.", ()),
    BLOCKS: ("counter", "Chunks moved to (op=store) or from (op=load) MemKV.", ("op",)),
    JOB_SECONDS: ("histogram", "Duration of MemKV transfer jobs, by op.", ("op",)),
    JOBS_FAILED: ("counter", "MemKV transfer jobs that failed, by op.", ("op",)),
    STORE_SHEDS: ("counter", "Store jobs shed because the store backlog was full.", ()),
    LOOKUPS: (
        "counter",
        "Lookups answered, by final result (hit, miss); a lookup vLLM retries while its "
        "exists round is in flight counts once, when answered.",
        ("result",),
    ),
    LOOKUP_ROUNDS: ("counter", "Batched exists rounds sent to MemKV.", ()),
    UNAVAILABLE: (
        "counter",
        "Chunks not loaded (recomputed) or not stored (dropped) because their member missed "
        "the stall budget or was skipped as down, by op.",
        ("op",),
    ),
    MEMBER_DOWN: ("counter", "Times a member was marked down (missed a deadline).", ("member",)),
    MEMBER_UP: ("counter", "Times a down member answered a probe and serves again.", ("member",)),
}


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """`build_metric_definitions` for vLLM (metadata classes from its base module)."""
    from . import _compat as c

    out: dict[str, OffloadingMetricMetadata] = {}
    for name, (kind, doc, labels) in METRICS.items():
        if kind == "counter":
            out[name] = c.OffloadingCounterMetadata(documentation=doc, labelnames=labels)
        elif kind == "gauge":
            out[name] = c.OffloadingGaugeMetadata(documentation=doc, labelnames=labels)
        else:
            out[name] = c.OffloadingHistogramMetadata(
                documentation=doc, labelnames=labels, buckets=LATENCY_BUCKETS
            )
    return out


class TierMetrics:
    """Accumulates observations from any thread; `take` hands them to vLLM."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self._samples: dict[tuple[str, tuple[str, ...]], list[float]] = defaultdict(list)
        # lifetime totals, for logs and tests
        self.totals: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self._seen: dict[str, tuple[int, int]] = {}  # member -> (went_down, came_up)

    def inc(self, name: str, value: float = 1, labels: tuple[str, ...] = ()) -> None:
        if not value:
            return
        with self._lock:
            self._counters[(name, labels)] += value
            self.totals[(name, labels)] += value

    def count_health(self, states: Iterable[MemberState]) -> None:
        """Count each member's down/up transitions since the last call."""
        for state in states:
            down, up = self._seen.get(state.address, (0, 0))
            self.inc(MEMBER_DOWN, state.went_down - down, (state.address,))
            self.inc(MEMBER_UP, state.came_up - up, (state.address,))
            self._seen[state.address] = (state.went_down, state.came_up)

    def count_lookup(self, answer: Answer) -> None:
        """Count one lookup by its final answer; PENDING (vLLM retries) is not final."""
        if answer is not Answer.PENDING:
            self.inc(LOOKUPS, 1, (answer.value,))

    def observe(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        with self._lock:
            self._samples[(name, labels)].append(value)

    def take(self) -> OffloadingConnectorStats | None:
        """An `OffloadingConnectorStats` with everything since the last call, or None."""
        with self._lock:
            counters, self._counters = self._counters, defaultdict(float)
            samples, self._samples = self._samples, defaultdict(list)
        if not counters and not samples:
            return None
        from . import _compat as c

        stats = c.new_stats()
        for (name, labels), value in counters.items():
            stats.increase_counter(name, value, labels)
        for (name, labels), values in samples.items():
            for v in values:
                stats.observe_histogram(name, v, labels)
        return stats
