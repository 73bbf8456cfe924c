"""A full L1 in front of a slow L2: `l1_overflow` decides whether new blocks or old ones lose.

Real files; the disk is made slow by delaying (or holding) every L2 write on its I/O thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import MakeConfig, hold_l2_writes, key
from kvpool_mmap import ConfigError, StoreConfig, Tier, TieredStore, bench_overload
from kvpool_mmap._io import BlockMover
from test_store import assert_blocks, check_invariants, put_chain, settle

Factory = Callable[..., TieredStore]
CHAIN = 4


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every L2 write takes 50 ms (a disk far slower than the stores arriving)."""
    write = BlockMover.write_block

    def slow(self: BlockMover, *args: object) -> list[int]:
        time.sleep(0.05)
        return write(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockMover, "write_block", slow)


@pytest.fixture
def held_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every L2 write waits for the yielded gate (released at teardown at the latest)."""
    gate = hold_l2_writes(monkeypatch)
    yield gate
    gate.set()


def overloaded(make_config: MakeConfig, **overrides: object) -> StoreConfig:
    """8 L1 slots, a 64-slot L2, one I/O thread, at most 2 background writes in flight."""
    return make_config(
        l1_slots=8, l2_slots=64, tp_size=2, io_threads=1, max_inflight_io=2, **overrides
    )


def stream(s: TieredStore, chains: int) -> list[int]:
    """Store `chains` new 4-block prompts back to back; the blocks each put stored."""
    return [put_chain(s, list(range(c * CHAIN, (c + 1) * CHAIN))) for c in range(chains)]


def readable_ids(s: TieredStore) -> list[int]:
    """The block ids the store offers now, in either tier."""
    return sorted(int.from_bytes(k[:32], "big") for k in s.keys(tier=None))


@pytest.mark.usefixtures("slow_disk")
def test_drop_unwritten_stores_and_hits_the_newest_blocks(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(overloaded(make_config, l1_overflow="drop_unwritten"))
    stored = stream(s, chains=6)  # 24 blocks through 8 slots; the disk writes 20 per second
    assert stored == [CHAIN] * 6
    st = s.stats()
    assert st.store_no_space == 0
    assert st.dropped_unwritten > 0
    newest = list(range(5 * CHAIN, 6 * CHAIN))
    assert s.lookup([key(i) for i in newest]) == [Tier.L1] * CHAIN
    assert_blocks(s, newest)
    settle(s)
    check_invariants(s)
    readable = readable_ids(s)
    assert set(newest) <= set(readable)
    assert_blocks(s, readable)  # every block still offered has exactly its bytes
    assert s.stats().checksum_failures == 0


@pytest.mark.usefixtures("slow_disk")
def test_by_default_new_blocks_are_refused_while_the_disk_catches_up(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    """The default (`demote`, the seed's design): victims wait for their L2 copy, so new
    blocks find no slot."""
    s = store_factory(overloaded(make_config))
    stored = stream(s, chains=6)
    assert stored[:2] == [CHAIN, CHAIN]  # L1 had room
    assert sum(stored[2:]) < 4 * CHAIN
    st = s.stats()
    assert st.store_no_space == 6 * CHAIN - sum(stored)
    assert st.dropped_unwritten == 0
    newest = [key(i) for i in range(5 * CHAIN, 6 * CHAIN)]
    assert len(s.lookup(newest)) < CHAIN
    settle(s)
    check_invariants(s)
    readable = readable_ids(s)
    assert_blocks(s, readable)
    assert s.stats().checksum_failures == 0


@pytest.mark.parametrize("overflow", ["drop_unwritten", "demote"])
def test_a_victim_is_never_reused_or_served_half_written(
    make_config: MakeConfig,
    store_factory: Factory,
    held_disk: threading.Event,
    overflow: str,
) -> None:
    """L1 is full; block 4's write-through is on the disk (held there), 5-7 wait in the
    queue. New blocks may take the slots of 5-7 (dropped: no L2 copy, no write started),
    never block 4's slot while its write reads it; after a restart L2 holds 4 intact."""
    cfg = make_config(
        l1_slots=4, l2_slots=32, tp_size=2, io_threads=1, max_inflight_io=1, l1_overflow=overflow
    )
    s = store_factory(cfg)
    assert put_chain(s, [4, 5, 6, 7]) == 4
    stored = put_chain(s, [8, 9, 10, 11])
    st = s.stats()
    if overflow == "drop_unwritten":
        assert stored == 3  # 5, 6, 7 dropped; 4's slot frees when its write lands
        assert st.dropped_unwritten == 3
        assert s.lookup([key(i) for i in (5, 6, 7)]) == []
        assert s.lookup([key(i) for i in (8, 9, 10)]) == [Tier.L1] * 3
    else:
        assert stored == 0  # every victim waits for its L2 write
        assert (st.dropped_unwritten, st.demotions) == (0, 3)
    assert_blocks(s, [4])  # still readable from L1 while its write is held
    held_disk.set()
    settle(s)
    check_invariants(s)
    assert s.lookup([key(4)]) == [Tier.L2]
    assert_blocks(s, readable_ids(s))
    s.close()
    again = store_factory(cfg)
    recovered = readable_ids(again)
    assert 4 in recovered
    assert_blocks(again, recovered)
    assert again.stats().checksum_failures == 0


def test_a_disk_that_keeps_up_loses_nothing(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    """Write-through lands between prompts: every victim is already in L2, none dropped."""
    s = store_factory(overloaded(make_config))
    for c in range(6):
        assert put_chain(s, list(range(c * CHAIN, (c + 1) * CHAIN))) == CHAIN
        settle(s)
    st = s.stats()
    assert (st.store_no_space, st.dropped_unwritten) == (0, 0)
    assert st.l1_evictions == 4 * CHAIN
    assert_blocks(s, list(range(6 * CHAIN)))


def test_bad_l1_overflow_names_the_setting(make_config: MakeConfig) -> None:
    with pytest.raises(ConfigError, match=r"l1_overflow must be one of .*drop_unwritten.*demote"):
        make_config(l1_overflow="refuse")


def only_in_l2(s: TieredStore, ids: list[int]) -> None:
    """Fill L1 with other blocks until `ids` (stored and written through) are only in L2."""
    put_chain(s, ids)
    settle(s)
    others = iter(range(1000, 2000))
    while s.lookup([key(ids[0])]) != [Tier.L2]:
        put_chain(s, [next(others) for _ in range(CHAIN)])
        settle(s)
    assert s.lookup([key(i) for i in ids]) == [Tier.L2] * len(ids)


def test_drop_unwritten_stores_a_block_found_only_in_l2_again(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    """A block recomputed instead of loaded from L2 gets an L1 copy again (as it would
    without L2); its L2 copy stays, so no second L2 write follows."""
    s = store_factory(overloaded(make_config, l1_overflow="drop_unwritten"))
    only_in_l2(s, [0, 1, 2, 3])
    aborted = s.begin_store([key(0)])
    assert aborted.l1_slots != [None]
    s.abort_store(aborted)  # the worker wrote nothing: the L2 copy is all there is, as before
    assert s.lookup([key(0)]) == [Tier.L2]
    check_invariants(s)
    writes = s.stats().write_throughs
    assert put_chain(s, [0, 1, 2, 3]) == CHAIN
    assert s.lookup([key(i) for i in range(CHAIN)]) == [Tier.L1] * CHAIN
    settle(s)
    st = s.stats()
    assert (st.restores, st.write_throughs, st.demotions) == (CHAIN + 1, writes, 0)
    assert_blocks(s, [0, 1, 2, 3])
    check_invariants(s)
    only_in_l2(s, [0, 1, 2, 3])  # the L1 copies leave again; L2 kept its own
    assert_blocks(s, [0, 1, 2, 3])


def test_demote_leaves_a_block_found_only_in_l2_there(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(overloaded(make_config))
    only_in_l2(s, [0, 1, 2, 3])
    assert put_chain(s, [0, 1, 2, 3]) == 0
    assert s.lookup([key(0)]) == [Tier.L2]
    assert s.stats().restores == 0


def l1_hits(s: TieredStore, prompts: list[list[int]]) -> list[int]:
    """Send each prompt as the connector does when loading from L2 is not worth it: load
    the L1 prefix, recompute and store the rest. The L1 hit of each prompt."""
    hits = []
    for ids in prompts:
        keys = [key(i) for i in ids]
        tiers = s.lookup(keys)
        hit = [*tiers, Tier.L2].index(Tier.L2)
        got = s.get(keys[:hit])
        assert len(got) == hit
        hits.append(hit)
        put_chain(s, ids)
        settle(s)
    return hits


def test_with_l2_behind_it_drop_unwritten_l1_hits_as_it_would_alone(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    """A session pushed out of L1 once comes back and stays hot: L1 alone re-stores it on
    its next miss and hits it from then on; L1 + L2 must do the same."""
    hot, cold = list(range(CHAIN)), [list(range(c * CHAIN, (c + 1) * CHAIN)) for c in (1, 2, 3)]
    prompts = [hot, cold[0], cold[1], hot, cold[2], hot, cold[0], hot, cold[1], hot]
    alone = store_factory(make_config(l2_slots=None, tp_size=2, engine_id="alone"))
    behind = store_factory(overloaded(make_config, l1_overflow="drop_unwritten"))
    expected = l1_hits(alone, prompts)
    assert sum(expected) >= 3 * CHAIN  # the hot session hits from its second return on
    assert l1_hits(behind, prompts) == expected
    assert behind.stats().restores > 0
    check_invariants(behind)


def test_the_overload_benchmark_runs_every_store_and_reports_each_round(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = ["--sessions", "4", "--blocks", "6", "--growth", "1", "--rounds", "2"]
    argv += ["--stride-kb", "4", "--l1-fraction", "0.5", "--l2-write-mbps", "0"]
    argv += ["--l1-dir", str(tmp_path), "--l2-dir", str(tmp_path), "--json", str(out)]
    assert bench_overload.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in results] == list(bench_overload.MODES)
    for r in results:
        assert len(r["round_hit_rates"]) == 2
        assert r["looked_up"] == 4 * (6 + 7)
    with pytest.raises(SystemExit):
        bench_overload.main(["--modes", "l1_only,refuse"])
