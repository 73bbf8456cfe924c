"""`tier_listener` reports every change of what each tier can load; retention hints."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from conftest import MakeConfig, block, key
from kv_eviction.retention import Retention
from kvpool_mmap import Tier, TieredStore

Factory = Callable[..., TieredStore]


class Replica:
    """What a subscriber knows from the listener alone: the keys each tier can load."""

    def __init__(self) -> None:
        self.tiers: dict[Tier, set[bytes]] = {Tier.L1: set(), Tier.L2: set()}

    def __call__(self, k: bytes, tier: Tier, loadable: bool) -> None:
        if loadable:
            self.tiers[tier].add(k)
        else:
            self.tiers[tier].discard(k)

    def matches(self, s: TieredStore) -> bool:
        return all(self.tiers[t] == set(s.keys(t)) for t in (Tier.L1, Tier.L2))


def store(s: TieredStore, ids: list[int], retention: Retention = Retention.NORMAL) -> None:
    keys = [key(i) for i in ids]
    ticket = s.begin_store(keys, retention=retention)
    for i, slot in zip(ids, ticket.l1_slots, strict=True):
        if slot is not None:
            s.l1_files[0].array[slot] = block(i)[0]
    s.commit_store(ticket)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("overflow", ["demote", "drop_unwritten"])
def test_replayed_changes_equal_each_tier(
    make_config: MakeConfig, store_factory: Factory, seed: int, overflow: str
) -> None:
    """Stores, hits with promotions, demotions, L2 evictions, a clear and a restart."""
    rng = np.random.default_rng(seed)
    write_through = bool(seed % 2)  # without it, L1 victims are demoted
    config = make_config(l1_slots=4, l2_slots=10, l1_overflow=overflow, write_through=write_through)
    s = store_factory(config)
    replica = Replica()
    s.tier_listener = replica
    for step in range(200):
        start = int(rng.integers(0, 30))
        ids = list(range(start, start + int(rng.integers(1, 4))))
        if rng.integers(0, 2):
            store(s, ids)
        else:
            ticket = s.begin_load([key(i) for i in ids])
            s.wait_load(ticket, 10)
            s.end_load(ticket)
        if step == 150:
            s.clear()
        s.tick()
        s._drain(10)
        assert replica.matches(s), step
    stats = s.stats()
    assert stats.l1_evictions > 0
    assert stats.l2_evictions > 0
    assert stats.promotions > 0
    assert write_through or stats.demotions
    s.close()
    reopened = store_factory(config)
    assert set(reopened.keys(Tier.L2)) == replica.tiers[Tier.L2]  # what a restart announces


def test_low_retention_is_never_written_to_l2(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=2, l2_slots=8))
    store(s, [1, 2], Retention.LOW)
    store(s, [3, 4])  # evicts the low blocks: dropped, not demoted
    s.flush()
    assert set(s.keys(Tier.L2)) == {key(3), key(4)}
    assert s.lookup([key(1)]) == []


def test_high_retention_outlives_an_eviction_wave(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=None, eviction_policy="lru"))
    store(s, [0, 1], Retention.HIGH)
    for wave in range(10, 40, 2):
        store(s, [wave, wave + 1])
    assert s.lookup([key(0), key(1)]) == [Tier.L1, Tier.L1]


def test_a_later_high_request_raises_stored_blocks(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=None, eviction_policy="lru"))
    store(s, [0, 1])
    store(s, [0, 1], Retention.HIGH)  # already stored: nothing written, kept longer
    for wave in range(10, 40, 2):
        store(s, [wave, wave + 1])
    assert s.lookup([key(0), key(1)]) == [Tier.L1, Tier.L1]


def test_raise_retention_keeps_found_blocks_and_never_lowers(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=5, l2_slots=None, eviction_policy="lru"))
    store(s, [0, 1])
    store(s, [2], Retention.HIGH)
    assert s.raise_retention([key(0), key(1), key(9)], Retention.HIGH) == 2  # 9: not stored
    assert s.raise_retention([key(2)], Retention.LOW) == 0
    for wave in range(10, 40, 2):
        store(s, [wave, wave + 1])
    assert s.lookup([key(0), key(1)]) == [Tier.L1, Tier.L1]
    assert s.lookup([key(2)]) == [Tier.L1]
