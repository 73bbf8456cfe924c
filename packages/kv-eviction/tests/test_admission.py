"""Admission: thresholds, bounded memory, and no starvation under one-shot floods."""

from __future__ import annotations

import pytest
from kv_eviction import AdmissionTracker


def test_threshold_one_admits_everything_and_stores_nothing() -> None:
    tracker = AdmissionTracker(threshold=1, max_entries=4)
    assert all(tracker.observe(i) for i in range(100))
    assert len(tracker) == 0


def test_a_hash_is_admitted_on_its_nth_sighting() -> None:
    tracker = AdmissionTracker(threshold=3, max_entries=100)
    assert [tracker.observe("h") for _ in range(4)] == [False, False, True, True]
    assert tracker.observe("one-shot") is False


def test_memory_is_bounded_by_max_entries() -> None:
    tracker = AdmissionTracker(threshold=2, max_entries=1000)
    for i in range(50_000):
        tracker.observe(i)
        assert len(tracker) <= 1000


@pytest.mark.parametrize("gap", [1, 100, 250, 498])
def test_no_starvation_under_a_flood_of_one_shots(gap: int) -> None:
    """Threshold 2, window max_entries // 2 = 500: two sightings 499 apart still admit."""
    tracker = AdmissionTracker(threshold=2, max_entries=1000)
    one_shot = iter(range(10**9))
    admitted = 0
    for round_ in range(40):
        for _ in range(777):  # flood before the hot hash shows up
            assert tracker.observe(("flood", next(one_shot))) is False
        hot = ("hot", round_)
        assert tracker.observe(hot) is False
        for _ in range(gap):
            tracker.observe(("flood", next(one_shot)))
        admitted += tracker.observe(hot)
    assert admitted == 40


def test_a_hash_repeating_slower_than_the_window_is_forgotten() -> None:
    tracker = AdmissionTracker(threshold=2, max_entries=10)
    tracker.observe("h")
    for i in range(20):  # 20 new hashes > two generations of 5
        tracker.observe(i)
    assert tracker.observe("h") is False


@pytest.mark.parametrize(("threshold", "max_entries"), [(0, 10), (2, 1), (True, 10)])
def test_bad_options_raise(threshold: int, max_entries: int) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        AdmissionTracker(threshold=threshold, max_entries=max_entries)
