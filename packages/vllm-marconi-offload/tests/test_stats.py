"""The log lines users grep for, from the counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpool_mmap import (
    RecoveredBlock,
    RecoveryReport,
    StoreConfig,
    Tier,
    TierConfig,
    TieredStore,
)
from vllm_marconi_offload.stats import (
    HitCounters,
    ReportedStats,
    TransferTimer,
    eviction_line,
    occupancy,
    recovery_line,
    store_counters,
)


def _store(tmp_path: Path, l1_blocks: int, *, l2: bool = False, **options: Any) -> TieredStore:
    """A standalone store of 4 KiB blocks: an L1 of `l1_blocks` slots, a 1 MiB L2 if `l2`,
    and any other StoreConfig `options`."""
    config = StoreConfig(
        stride=4096,
        engine_id="stats",
        fingerprint=b"stats",
        l1=TierConfig(tmp_path / "l1", l1_blocks * 4096),
        l2=TierConfig(tmp_path / "l2", 1 << 20) if l2 else None,
        **options,
    )
    return TieredStore(config)


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
    with _store(tmp_path, l1_blocks=2) as store:
        first = store.begin_store([b"a" * 16, b"b" * 16])
        store.commit_store(first)
        load = store.begin_load([b"a" * 16, b"b" * 16])  # both pinned: nothing can be evicted
        refused = store.begin_store([b"c" * 16, b"d" * 16, b"e" * 16])
        assert refused.allocated == []
        assert "not_stored=3" in eviction_line(store.stats())
        assert store_counters(store.stats())["not_stored"] == 3
        store.abort_store(refused)
        store.end_load(load)


def test_occupancy_counts_blocks_and_bytes_per_tier(tmp_path: Path) -> None:
    with _store(tmp_path, l1_blocks=8) as store:
        store.commit_store(store.begin_store([b"a" * 16, b"b" * 16, b"c" * 16]))
        gauges = occupancy(store.stats(), store.config)
    assert gauges["l1_used_blocks"] == 3
    assert gauges["l1_used_bytes"] == 3 * 4096
    assert gauges["l1_capacity_bytes"] == gauges["l1_capacity_blocks"] * 4096 > 0
    assert gauges["l2_used_blocks"] == gauges["l2_capacity_bytes"] == 0


def test_recovery_line_says_what_was_kept_and_why_the_rest_was_dropped() -> None:
    report = RecoveryReport(corrupt_headers=2, incomplete=3, duplicates=1, wiped_files=1)
    report.blocks.extend([RecoveredBlock(slot=i, key=b"k", generation=1, depth=0, checksums=[]) for i in range(5)])  # fmt: skip
    line = recovery_line(report, "/kv/l2")
    assert line.startswith("L2 recovery: 5 blocks recovered from /kv/l2, 6 dropped ")
    assert "torn_headers=2 incomplete_across_ranks=3 older_duplicates=1 bad_checksums=0" in line
    assert line.endswith("rank files wiped for another model/layout: 1")


def test_transfer_timer_times_each_transfer_once() -> None:
    now = [10.0]
    timer = TransferTimer(clock=lambda: now[0])
    timer.start("load", "req-1")
    timer.start("store", 7)
    timer.start("load", "req-2")
    now[0] = 10.25
    timer.finish("load", "req-1")
    timer.finish("load", "req-1")  # reported twice: counted once
    timer.forget("load", "req-2")  # aborted
    now[0] = 10.5
    timer.finish("store", 7)
    timer.finish("load", "req-2")
    assert timer.take() == {"load_seconds": [0.25], "store_seconds": [0.5]}
    assert timer.take() == {}


def test_reports_send_counter_increments_and_changed_gauges_only() -> None:
    reported = ReportedStats()
    assert reported.changes({"stored_blocks": 4}, {"l1_used_blocks": 4}) == {
        "stored_blocks": 4,
        "l1_used_blocks": 4,
    }
    assert reported.changes({"stored_blocks": 4}, {"l1_used_blocks": 4}) == {}
    assert reported.changes({"stored_blocks": 6}, {"l1_used_blocks": 0}) == {
        "stored_blocks": 2,
        "l1_used_blocks": 0,
    }


def test_victims_dropped_before_reaching_l2_are_reported(tmp_path: Path) -> None:
    """With L2 writes behind, a full L1 under `l1_overflow="drop_unwritten"` drops its
    oldest unwritten blocks to store new ones; the log line and the metrics count them."""
    with _store(
        tmp_path, 4, l2=True, write_through=False, max_inflight_io=1, l1_overflow="drop_unwritten"
    ) as store:
        store.put([bytes([i]) * 16 for i in range(4)], [[i] * 4096 for i in range(4)])
        # the first victim's demotion is the one write allowed in flight: the others drop
        assert store.put([bytes([i]) * 16 for i in range(4, 8)], [[0] * 4096] * 4) == 3
        assert "not_stored=1 dropped_unwritten=3" in eviction_line(store.stats())
        assert store_counters(store.stats())["dropped_unwritten"] == 3


def test_blocks_stored_into_l1_again_from_l2_are_reported(tmp_path: Path) -> None:
    """Under `drop_unwritten` a block found only in L2 and stored again gets an L1 slot;
    the log line and the metrics count it."""
    with _store(tmp_path, 2, l2=True, l1_overflow="drop_unwritten") as store:
        keys = [bytes([i]) * 16 for i in range(4)]
        for k in keys:
            store.put([k], [[1] * 4096])
            store.flush()
        assert store.lookup(keys[:1]) == [Tier.L2]
        assert store.put(keys[:1], [[1] * 4096]) == 1
        assert "restores=1" in eviction_line(store.stats())
        assert store_counters(store.stats())["restores"] == 1
