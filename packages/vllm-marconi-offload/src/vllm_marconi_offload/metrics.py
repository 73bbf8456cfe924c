"""The connector's counters, gauges and latencies as vLLM KV-connector stats and
Prometheus metrics.

Stats flow scheduler -> vLLM's logging process as `OffloadStats.data`: counter increments
(ints), gauge values (ints, the latest wins) and latency samples (lists of seconds); vLLM
rebuilds them with `build_kv_connector_stats` and hands them to `OffloadPromMetrics`,
which creates every series at zero when vLLM starts.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm_kv_identity.vocabulary import LATENCY_BUCKETS

# stats key -> (metric name, help, tier label or None)
_COUNTERS: dict[str, tuple[str, str, str | None]] = {
    "lookup_tokens": (
        "vllm:marconi_offload_lookup_tokens",
        "Prompt tokens looked up in the offload tiers.",
        None,
    ),
    "hit_tokens_l1": ("vllm:marconi_offload_hit_tokens", "Prompt tokens found, by tier.", "l1"),
    "hit_tokens_l2": ("vllm:marconi_offload_hit_tokens", "Prompt tokens found, by tier.", "l2"),
    "loaded_blocks": (
        "vllm:marconi_offload_loaded_blocks",
        "Blocks copied from L1 into the GPU KV cache.",
        None,
    ),
    "stored_blocks": (
        "vllm:marconi_offload_stored_blocks",
        "Blocks copied from the GPU KV cache into L1.",
        None,
    ),
    "l2_skipped_blocks": (
        "vllm:marconi_offload_l2_skipped_blocks",
        "L2 hits recomputed because loading them was estimated slower than prefill.",
        None,
    ),
    "evictions_l1": ("vllm:marconi_offload_evictions", "Blocks evicted, by tier.", "l1"),
    "evictions_l2": ("vllm:marconi_offload_evictions", "Blocks evicted, by tier.", "l2"),
    "demotes": ("vllm:marconi_offload_demotions", "Blocks moved from L1 to L2.", None),
    "promotes": ("vllm:marconi_offload_promotions", "Blocks moved from L2 to L1.", None),
    "checksum_failures": (
        "vllm:marconi_offload_checksum_failures",
        "L2 blocks that failed their checksum and were treated as misses.",
        None,
    ),
    "not_stored": (
        "vllm:marconi_offload_not_stored_blocks",
        "Blocks not stored because no L1 slot was free (pinned by loads or awaiting L2 writes).",
        None,
    ),
    "dropped_unwritten": (
        "vllm:marconi_offload_dropped_unwritten_blocks",
        "L1 victims dropped before their L2 copy was written (L2 writes behind).",
        None,
    ),
    "restores": (
        "vllm:marconi_offload_restored_blocks",
        "Blocks stored into L1 again while L2 held them (recomputed instead of loaded).",
        None,
    ),
}


_OCCUPANCY_DOC = {
    "used_blocks": "Blocks held, by tier.",
    "used_bytes": "Bytes held, by tier (a block's slots on every tensor-parallel rank).",
    "capacity_blocks": "Blocks the tier can hold.",
    "capacity_bytes": "Bytes the tier can hold.",
}
# stats key -> (metric name, help, tier label)
_GAUGES: dict[str, tuple[str, str, str]] = {
    f"{tier}_{what}": (f"vllm:marconi_offload_{what}", doc, tier)
    for tier in ("l1", "l2")
    for what, doc in _OCCUPANCY_DOC.items()
}
# stats key -> (metric name, help); values are lists of seconds
_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "load_seconds": (
        "vllm:marconi_offload_load_seconds",
        "Seconds from queueing a request's load (L1 -> GPU) to the workers finishing it.",
    ),
    "store_seconds": (
        "vllm:marconi_offload_store_seconds",
        "Seconds from queueing a store (GPU -> L1) to every worker finishing it.",
    ),
}


_GAUGE_NAMES = frozenset(name for name, _, _ in _GAUGES.values())


class OffloadStats(KVConnectorStats):  # type: ignore[misc]
    """Since the last report: counter increments, gauge values, latency samples."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> OffloadStats:
        for key, value in other.data.items():
            if key in _GAUGES:
                self.data[key] = value
            elif key in _HISTOGRAMS:
                self.data[key] = [*self.data.get(key, ()), *value]
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        reduced: dict[str, int | float] = {}
        for key, value in self.data.items():
            if key in _HISTOGRAMS:
                if value:
                    reduced[f"{key}_count"] = len(value)
                    reduced[f"{key}_mean"] = round(sum(value) / len(value), 6)
            elif value or key in _GAUGES:
                reduced[key] = value
        return reduced

    def is_empty(self) -> bool:
        return not any(self.data.values()) and not any(key in _GAUGES for key in self.data)


class OffloadPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """Prometheus series for `OffloadStats`, labelled by tier where it applies; every
    series of every engine exists (at zero) from startup."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._metrics: dict[str, Any] = {}
        for name, documentation, tier in [*_COUNTERS.values(), *_GAUGES.values()]:
            if name in self._metrics:
                continue
            labels = [*labelnames, "tier"] if tier else list(labelnames)
            make = self._gauge_cls if name in _GAUGE_NAMES else self._counter_cls
            self._metrics[name] = make(name=name, documentation=documentation, labelnames=labels)
        histogram: Any = self._histogram_cls  # vLLM types it as any metric class
        for name, documentation in _HISTOGRAMS.values():
            self._metrics[name] = histogram(
                name=name,
                documentation=documentation,
                labelnames=list(labelnames),
                buckets=list(LATENCY_BUCKETS),
            )
        for engine_idx in per_engine_labelvalues:
            for key in [*_COUNTERS, *_GAUGES, *_HISTOGRAMS]:
                self._series(key, engine_idx)  # created now: exported at zero

    def _series(self, key: str, engine_idx: int) -> Any:
        labelvalues = list(self.per_engine_labelvalues[engine_idx])
        if key in _HISTOGRAMS:
            return self._metrics[_HISTOGRAMS[key][0]].labels(*labelvalues)
        name, _, tier = _COUNTERS[key] if key in _COUNTERS else _GAUGES[key]
        return self._metrics[name].labels(*labelvalues, *([tier] if tier else []))

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            if key in _GAUGES:
                self._series(key, engine_idx).set(value)
            elif key in _HISTOGRAMS:
                series = self._series(key, engine_idx)
                for seconds in value:
                    series.observe(seconds)
            elif key in _COUNTERS and value:
                self._series(key, engine_idx).inc(value)
