"""The log lines users grep for, from the counters."""

from __future__ import annotations

from pathlib import Path

from kvpool_mmap import StoreConfig, TierConfig, TieredStore
from vllm_marconi_offload.stats import HitCounters, eviction_line, store_counters


def test_hit_line_splits_tokens_and_requests_by_tier() -> None:
    counters = HitCounters()
    for _ in range(4):
        counters.record_lookup(prompt_tokens=1000)
    counters.record_hit(block_size=100, l1=5, l2=0)
    counters.record_hit(block_size=100, l1=2, l2=3)
    counters.record_hit(block_size=100, l1=0, l2=1)
    line = counters.hit_line()
    assert line.startswith("[CPU-OFFLOAD HIT] requests=4 request_hit_rate=75.0%")
    assert "(l1_only=1 l2_only=1 mixed=1)" in line
    assert "token_hit_rate=27.5% (l1=17.5% l2=10.0%)" in line
    assert "hit_tokens=1100 lookup_tokens=4000" in line


def test_blocks_that_find_no_l1_slot_are_reported(tmp_path: Path) -> None:
    """A full L1 whose blocks cannot leave yet refuses stores; the log line and the
    metrics must say how many blocks were not stored."""
    config = StoreConfig(
        stride=4096,
        engine_id="stats",
        fingerprint=b"stats",
        l1=TierConfig(tmp_path / "l1", 2 * 4096),
    )
    store = TieredStore(config)
    try:
        first = store.begin_store([b"a" * 16, b"b" * 16])
        store.commit_store(first)
        load = store.begin_load([b"a" * 16, b"b" * 16])  # both pinned: nothing can be evicted
        refused = store.begin_store([b"c" * 16, b"d" * 16, b"e" * 16])
        assert refused.allocated == []
        assert "not_stored=3" in eviction_line(store.stats())
        assert store_counters(store.stats())["not_stored"] == 3
        store.abort_store(refused)
        store.end_load(load)
    finally:
        store.close()


def test_victims_dropped_before_reaching_l2_are_reported(tmp_path: Path) -> None:
    """With L2 writes behind, a full L1 drops its oldest unwritten blocks to store new
    ones (the default `l1_overflow`); the log line and the metrics count them."""
    config = StoreConfig(
        stride=4096,
        engine_id="stats",
        fingerprint=b"stats",
        l1=TierConfig(tmp_path / "l1", 4 * 4096),
        l2=TierConfig(tmp_path / "l2", 1 << 20),
        write_through=False,
        max_inflight_io=1,
    )
    store = TieredStore(config)
    try:
        store.put([bytes([i]) * 16 for i in range(4)], [[i] * 4096 for i in range(4)])
        # the first victim's demotion is the one write allowed in flight: the others drop
        assert store.put([bytes([i]) * 16 for i in range(4, 8)], [[0] * 4096] * 4) == 3
        assert "not_stored=1 dropped_unwritten=3" in eviction_line(store.stats())
        assert store_counters(store.stats())["dropped_unwritten"] == 3
    finally:
        store.close()
