"""The connector's counters as vLLM KV-connector stats and Prometheus metrics.

Stats flow scheduler -> vLLM's logging process as `OffloadStats.data` (plain ints); vLLM
rebuilds them with `build_kv_connector_stats` and hands them to `OffloadPromMetrics`.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

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
}


class OffloadStats(KVConnectorStats):  # type: ignore[misc]
    """Counter increments since the last report; all values are ints."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> OffloadStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {key: value for key, value in self.data.items() if value}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class OffloadPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """Prometheus counters for `OffloadStats`, labelled by tier where it applies."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._metrics: dict[str, Any] = {}
        for name, documentation, tier in _COUNTERS.values():
            if name in self._metrics:
                continue
            labels = [*labelnames, "tier"] if tier else list(labelnames)
            self._metrics[name] = self._counter_cls(
                name=name, documentation=documentation, labelnames=labels
            )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labelvalues = self.per_engine_labelvalues[engine_idx]
        for key, value in transfer_stats_data.items():
            spec = _COUNTERS.get(key)
            if spec is None or not value:
                continue
            name, _, tier = spec
            labels = [*labelvalues, tier] if tier else list(labelvalues)
            self._metrics[name].labels(*labels).inc(value)
