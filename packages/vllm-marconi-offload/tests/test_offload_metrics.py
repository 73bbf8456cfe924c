"""The connector's Prometheus series: all present at zero from startup, then fed by stats."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm  # the metrics are vLLM's KV-connector stats types
pytest.importorskip("vllm")

from prometheus_client import (  # noqa: E402
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from vllm_marconi_offload.metrics import OffloadPromMetrics, OffloadStats  # noqa: E402


def _metrics() -> tuple[OffloadPromMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=registry) for cls in (Gauge, Counter, Histogram)}
    config = SimpleNamespace(kv_transfer_config=None)
    metrics = OffloadPromMetrics(config, types, ["model_name", "engine"], {0: ["m", "0"]})
    return metrics, registry


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_every_series_exists_at_zero_before_any_stats() -> None:
    _, registry = _metrics()
    samples = _samples(registry)
    labels = 'engine="0",model_name="m"'
    for tier in ("l1", "l2"):
        assert samples[f'vllm:marconi_offload_hit_tokens_total{{{labels},tier="{tier}"}}'] == 0
        assert samples[f'vllm:marconi_offload_evictions_total{{{labels},tier="{tier}"}}'] == 0
        for gauge in ("used_blocks", "used_bytes", "capacity_blocks", "capacity_bytes"):
            assert samples[f'vllm:marconi_offload_{gauge}{{{labels},tier="{tier}"}}'] == 0
    assert samples[f"vllm:marconi_offload_stored_blocks_total{{{labels}}}"] == 0
    assert samples[f"vllm:marconi_offload_load_seconds_count{{{labels}}}"] == 0
    assert samples[f"vllm:marconi_offload_store_seconds_count{{{labels}}}"] == 0


def test_stats_feed_counters_gauges_and_latency_histograms() -> None:
    metrics, registry = _metrics()
    first = OffloadStats(data={"stored_blocks": 3, "l1_used_blocks": 3, "load_seconds": [0.02]})
    second = OffloadStats(data={"stored_blocks": 2, "l1_used_blocks": 1, "load_seconds": [0.5]})
    merged = first.aggregate(second)
    assert merged.data == {"stored_blocks": 5, "l1_used_blocks": 1, "load_seconds": [0.02, 0.5]}
    assert merged.reduce() == {
        "stored_blocks": 5,
        "l1_used_blocks": 1,
        "load_seconds_count": 2,
        "load_seconds_mean": 0.26,
    }
    metrics.observe(merged.data)
    samples = _samples(registry)
    labels = 'engine="0",model_name="m"'
    assert samples[f"vllm:marconi_offload_stored_blocks_total{{{labels}}}"] == 5
    assert samples[f'vllm:marconi_offload_used_blocks{{{labels},tier="l1"}}'] == 1
    assert samples[f"vllm:marconi_offload_load_seconds_count{{{labels}}}"] == 2
    bucket = 'vllm:marconi_offload_load_seconds_bucket{engine="0",le="0.025",model_name="m"}'
    assert samples[bucket] == 1
    assert OffloadStats(data={}).is_empty() is not False
    assert not OffloadStats(data={"l2_used_blocks": 0}).is_empty()  # a gauge back at zero
