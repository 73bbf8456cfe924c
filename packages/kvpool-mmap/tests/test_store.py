"""TieredStore on real files: fill, evict, demote, promote, pins, restart, corruption."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeConfig, block, hold_l2_writes, key
from kvpool_mmap import (
    LoadStatus,
    PoolInUseError,
    StoreConfig,
    Tier,
    TieredStore,
)
from kvpool_mmap._codec import encode_header, payload_checksum
from kvpool_mmap._index import SlotState
from kvpool_mmap._io import BlockMover
from kvpool_mmap._l2file import L2RankFile

Factory = Callable[..., TieredStore]


def check_invariants(s: TieredStore) -> None:
    """No slot is owned twice; owned + free == all slots; states agree with policies."""
    l1_owned = [e.l1 for e in s._entries.values() if e.l1 >= 0]
    l2_owned = [e.l2 for e in s._entries.values() if e.l2 >= 0]
    l1_free = s._l1_free.snapshot()
    l2_free = s._l2_free.snapshot()
    assert len(set(l1_owned)) == len(l1_owned)
    assert len(set(l2_owned)) == len(l2_owned)
    assert sorted(l1_owned + l1_free) == list(range(s.config.l1_slots))
    assert sorted(l2_owned + l2_free) == list(range(s.config.l2_slots))
    for k, e in s._entries.items():
        assert (k in s._l1_policy) == (e.l1_state == SlotState.VALID and not e.evicting)
        if s._l2_policy is not None:
            assert (k in s._l2_policy) == (e.l2_state == SlotState.VALID)


def put_chain(s: TieredStore, ids: list[int]) -> int:
    tp = s.config.tp_size
    return s.put([key(i) for i in ids], np.stack([block(i, tp) for i in ids]))


def assert_blocks(s: TieredStore, ids: list[int]) -> None:
    """Load the blocks (in chunks that fit L1) and compare with what was stored."""
    n = s.config.l1_slots
    for chunk in (ids[j : j + n] for j in range(0, len(ids), n)):
        got = s.get([key(i) for i in chunk])
        assert len(got) == len(chunk)
        for i, g in zip(chunk, got, strict=True):
            np.testing.assert_array_equal(g, block(i, s.config.tp_size))


def settle(s: TieredStore) -> None:
    s._drain(10)


def test_l1_only_fill_evict_lookup(make_config: MakeConfig, store_factory: Factory) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=None))
    assert put_chain(s, [0, 1, 2, 3]) == 4
    assert s.lookup([key(0), key(1), key(9), key(2)]) == [Tier.L1, Tier.L1]
    assert_blocks(s, [0, 1, 2, 3])
    assert put_chain(s, [10, 11]) == 2  # evicts the chain's tail (leaves first)
    assert s.lookup([key(0), key(1), key(2), key(3)]) == [Tier.L1, Tier.L1]
    assert s.stats().l1_evictions == 2
    check_invariants(s)


def test_demote_on_eviction_then_promote(make_config: MakeConfig, store_factory: Factory) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=16, tp_size=2, write_through=False))
    assert put_chain(s, [0, 1, 2, 3]) == 4
    assert s.stats().l2_used == 0  # no write-through
    # the dirty victims are demoted; their slots free up once the demotion lands
    stored = put_chain(s, [10, 11, 12, 13])
    settle(s)
    stored += put_chain(s, [10, 11, 12, 13][stored:])
    assert stored == 4
    st = s.stats()
    assert st.demotions == 4
    assert st.l2_used == 4
    assert s.lookup([key(i) for i in (0, 1, 2, 3)]) == [Tier.L2] * 4
    assert_blocks(s, [0, 1, 2, 3])  # promotion with checksum verification
    assert s.stats().promotions == 4
    assert s.stats().l2_hits == 4
    check_invariants(s)


def test_write_through_and_restart_identical(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    cfg = make_config(l1_slots=4, l2_slots=64, tp_size=2)
    s = TieredStore(cfg)
    for start in range(0, 40, 4):
        put_chain(s, list(range(start, start + 4)))
        settle(s)
    before = sorted(s.keys(Tier.L2))
    assert len(before) == 40
    s.close()
    s2 = store_factory(cfg)
    assert sorted(s2.keys()) == before
    assert s2.recovery.incomplete == s2.recovery.corrupt_headers == 0
    assert_blocks(s2, list(range(40)))
    check_invariants(s2)


def test_l2_victims_are_dropped(make_config: MakeConfig, store_factory: Factory) -> None:
    s = store_factory(make_config(l1_slots=2, l2_slots=6))
    for i in range(20):
        put_chain(s, [100 + i])
        settle(s)
    st = s.stats()
    assert st.l2_used == 6
    assert st.l2_evictions == 14
    assert len(s.keys(Tier.L2)) == 6
    assert_blocks(s, [119])
    check_invariants(s)


def test_pinned_slots_are_never_evicted_or_reused(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=None))
    put_chain(s, [0, 1])
    load = s.begin_load([key(0), key(1)])
    assert s.poll_load(load) is LoadStatus.READY
    pending = s.begin_store([key(5)])  # allocated, not yet committed: pinned too
    assert pending.l1_slots[0] is not None
    busy = set(load.l1_slots) | {pending.l1_slots[0]}
    t = s.begin_store([key(i) for i in range(20, 30)])
    got = {x for x in t.l1_slots if x is not None}
    assert len(got) == 1
    assert not got & busy
    assert s.stats().store_no_space == 9
    s.abort_store(t)
    s.commit_store(pending)
    s.end_load(load)
    np.testing.assert_array_equal(s.l1_files[0].array[load.l1_slots[0]], block(0)[0])
    check_invariants(s)


def test_already_stored_and_admission(make_config: MakeConfig, store_factory: Factory) -> None:
    s = store_factory(make_config(admission_threshold=2))
    t = s.begin_store([key(1), key(2)])
    assert t.l1_slots == [None, None]
    assert s.stats().not_admitted == 2
    t = s.begin_store([key(1), key(2)])
    assert None not in t.l1_slots
    s.commit_store(t)
    t = s.begin_store([key(1), key(2), key(3)])
    assert t.l1_slots[:2] == [None, None]  # already stored


def test_flipped_byte_is_a_miss_never_data(
    make_config: MakeConfig, store_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(l1_slots=2, l2_slots=8, tp_size=2)
    s = TieredStore(cfg)
    put_chain(s, [0, 1])
    s.close()
    f = L2RankFile(cfg, 1)
    slot = next(i for i in range(cfg.l2_slots) if f.read_header_table()[i, 0] != 0)
    raw = bytearray(f.read_payload_copy(slot))
    raw[1234] ^= 0x10
    f.write_payload(slot, memoryview(bytes(raw)))
    f.close()
    s = store_factory(cfg)
    assert len(s.recovery.blocks) == 2
    with caplog.at_level(logging.WARNING, logger="kvpool_mmap"):
        tickets = [s.begin_load([key(i)]) for i in (0, 1)]
        statuses = [s.wait_load(t, 10) for t in tickets]
    assert sorted(statuses, key=str) == [LoadStatus.FAILED, LoadStatus.READY]
    assert "failed its checksum" in caplog.text
    bad = tickets[statuses.index(LoadStatus.FAILED)]
    assert bad.ready_prefix == 0
    for t in tickets:
        s.end_load(t)
    st = s.stats()
    assert st.checksum_failures == 1
    assert st.load_failures == 1
    assert len(s.keys()) == 1  # the bad copy was dropped
    check_invariants(s)


def test_verify_on_open_drops_corrupt_payload(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    cfg = make_config(l1_slots=2, l2_slots=8)
    s = TieredStore(cfg)
    put_chain(s, [0, 1])
    s.close()
    with open(cfg.l2_file(0), "r+b") as fh:  # flip one byte in the first payload
        off = L2RankFile.__new__(L2RankFile)
        del off
        data_offset = 4096 + 4096  # superblock + header table (8 * 256 rounded to a page)
        fh.seek(data_offset + 17)
        b = fh.read(1)
        fh.seek(data_offset + 17)
        fh.write(bytes([b[0] ^ 1]))
    s = store_factory(cfg.__class__(**{**cfg.__dict__, "verify_on_open": True}))
    assert s.recovery.bad_payloads == 1
    assert len(s.recovery.blocks) == 1


def test_torn_header_and_incomplete_ranks(make_config: MakeConfig, store_factory: Factory) -> None:
    cfg = make_config(l1_slots=4, l2_slots=8, tp_size=2)
    s = TieredStore(cfg)
    put_chain(s, [0, 1, 2])
    s.close()
    f0, f1 = L2RankFile(cfg, 0), L2RankFile(cfg, 1)
    live = [i for i in range(8) if f0.read_header_table()[i, 0] != 0]
    assert len(live) == 3
    torn = bytearray(encode_header(key(0), 1, cfg.stride, 5))
    torn[100] ^= 1
    f0.write_header(live[0], bytes(torn))  # a torn header in rank 0
    f1.invalidate(live[1])  # rank 1 never got its header (crash between ranks)
    f0.close()
    f1.close()
    s = store_factory(cfg)
    rep = s.recovery
    assert rep.corrupt_headers == 1
    assert rep.incomplete == 2
    assert len(rep.blocks) == 1
    check_invariants(s)


def test_duplicate_key_newest_generation_wins(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    cfg = make_config(l1_slots=2, l2_slots=8)
    s = TieredStore(cfg)
    put_chain(s, [0])
    s.close()
    f = L2RankFile(cfg, 0)
    old = np.zeros(cfg.stride, dtype=np.uint8)  # an older copy of key 0 in slot 7
    f.write_payload(7, memoryview(old.tobytes()))
    f.write_header(7, encode_header(key(0), 0, cfg.stride, payload_checksum(old.tobytes())))
    f.close()
    s = store_factory(cfg)
    assert s.recovery.duplicates == 1
    assert len(s.recovery.blocks) == 1
    assert_blocks(s, [0])


def test_fingerprint_change_wipes_l2(
    make_config: MakeConfig, store_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    s = TieredStore(make_config())
    put_chain(s, [0, 1])
    s.close()
    with caplog.at_level(logging.WARNING, logger="kvpool_mmap"):
        s = store_factory(make_config(fingerprint=b"another model"))
    assert "wiping" in caplog.text
    assert "fingerprint" in caplog.text
    assert len(s) == 0
    assert s.recovery.wiped_files == 1
    s.close()
    s = store_factory(make_config())  # and the old one does not come back
    assert len(s) == 0


def test_stride_change_wipes_l2(make_config: MakeConfig, store_factory: Factory) -> None:
    s = TieredStore(make_config())
    put_chain(s, [0])
    s.close()
    s = store_factory(make_config(stride=8192, l2_slots=16))
    assert len(s) == 0
    assert s.recovery.wiped_files == 1


def test_two_engines_share_a_directory(tmp_path: Path, make_config: MakeConfig) -> None:
    a = TieredStore(make_config(engine_id="engine-a"))
    b = TieredStore(make_config(engine_id="engine-b"))
    put_chain(a, [0, 1])
    put_chain(b, [2])
    a.close()
    b.close()
    names = sorted(p.name for p in (tmp_path / "l2").iterdir())
    assert names == ["kvpool-engine-a-dp0-tp0.l2", "kvpool-engine-b-dp0-tp0.l2"]
    a = TieredStore(make_config(engine_id="engine-a"))
    b = TieredStore(make_config(engine_id="engine-b"))
    try:
        assert sorted(a.keys()) == [key(0), key(1)]
        assert b.keys() == [key(2)]
        assert_blocks(a, [0, 1])
        assert_blocks(b, [2])
    finally:
        a.close()
        b.close()


def test_same_engine_twice_is_refused(make_config: MakeConfig, store_factory: Factory) -> None:
    store_factory(make_config())
    with pytest.raises(PoolInUseError, match=r"in use by process \d+ .*engine_id"):
        TieredStore(make_config())


def test_dp_ranks_get_their_own_files(make_config: MakeConfig) -> None:
    cfgs = [make_config(dp_size=2, dp_rank=r, l1_slots=8, l2_slots=32) for r in (0, 1)]
    stores = [TieredStore(c) for c in cfgs]
    try:
        put_chain(stores[0], [1])
        assert stores[1].lookup([key(1)]) == []
    finally:
        for s in stores:
            s.close()


def test_cancelled_load_releases_everything(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=4, l2_slots=16))
    put_chain(s, [0, 1, 2, 3])
    settle(s)
    put_chain(s, [4, 5, 6, 7])  # evicts 0..3 from L1 (clean: already written through)
    settle(s)
    load = s.begin_load([key(i) for i in range(4)])
    s.end_load(load)  # cancel, possibly before the promotions finished
    settle(s)
    check_invariants(s)
    assert all(e.l1_pins == 0 and e.l2_pins == 0 for e in s._entries.values())
    assert_blocks(s, [0, 1, 2, 3])


@pytest.mark.parametrize("overflow", ["drop_unwritten", "demote"])
@pytest.mark.parametrize("seed", range(12))
def test_randomised_workload_keeps_invariants(
    make_config: MakeConfig,
    store_factory: Factory,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    overflow: str,
) -> None:
    """Random stores, loads held open, waited for or cancelled, on small tiers, with every
    L2 transfer delayed by a random 0-2 ms so that completions interleave differently,
    under both answers to a full L1 (`l1_overflow`)."""
    delays = random.Random(seed)
    write, read = BlockMover.write_block, BlockMover.read_block

    def slow_write(self: BlockMover, *args: object) -> list[int]:
        time.sleep(delays.random() * 0.002)
        return write(self, *args)  # type: ignore[arg-type]

    def slow_read(self: BlockMover, *args: object) -> bool:
        time.sleep(delays.random() * 0.002)
        return read(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockMover, "write_block", slow_write)
    monkeypatch.setattr(BlockMover, "read_block", slow_read)
    rng = np.random.default_rng(seed)
    cfg = make_config(
        l1_slots=int(rng.integers(3, 8)),
        l2_slots=int(rng.integers(4, 24)),
        tp_size=2,
        write_through_queue=int(rng.integers(1, 6)),
        io_threads=int(rng.integers(1, 4)),
        max_inflight_io=int(rng.integers(1, 4)),
        l1_overflow=overflow,
    )
    s = store_factory(cfg)
    open_loads = []
    for _step in range(300):
        op = rng.integers(0, 5)
        start = int(rng.integers(0, 40))
        ids = list(range(start, start + int(rng.integers(1, 5))))
        if op == 0:
            put_chain(s, ids)
        elif op == 1:
            open_loads.append(s.begin_load([key(i) for i in ids]))
        elif op == 2 and open_loads:
            t = open_loads.pop(int(rng.integers(0, len(open_loads))))
            assert s.wait_load(t, 10) is not LoadStatus.PENDING  # never waits on another load
            # with loads held open, L1 can run out of slots: a failure, never wrong data
            for k, slot in zip(t.keys, t.l1_slots, strict=True):
                if k in t.failed:
                    continue
                i = int.from_bytes(k[:32], "big")
                for r in range(2):
                    np.testing.assert_array_equal(s.l1_files[r].array[slot], block(i, 2)[r])
            s.end_load(t)
        elif op == 3 and open_loads:
            s.end_load(open_loads.pop(int(rng.integers(0, len(open_loads)))))  # cancel
        else:
            s.tick()
        check_invariants(s)
    for t in open_loads:
        s.end_load(t)
    settle(s)
    check_invariants(s)
    assert all(e.l1_pins == 0 and e.l2_pins == 0 for e in s._entries.values())
    assert s.stats().checksum_failures == 0


def test_config_round_trip_through_dict(make_config: MakeConfig) -> None:
    cfg = make_config()
    d = {**cfg.__dict__, "l1": cfg.l1.__dict__, "l2": cfg.l2.__dict__ if cfg.l2 else None}
    assert StoreConfig.from_dict(d) == cfg


def test_clear_drops_everything_unpinned(make_config: MakeConfig, store_factory: Factory) -> None:
    cfg = make_config(l1_slots=4, l2_slots=16)
    s = TieredStore(cfg)
    put_chain(s, [0, 1, 2])
    settle(s)
    load = s.begin_load([key(0)])
    assert s.clear() == 2  # key 0 is pinned by the load
    assert s.lookup([key(0), key(1)]) == [Tier.L1]
    s.end_load(load)
    assert s.clear() == 1
    assert len(s) == 0
    check_invariants(s)
    s.close()
    assert len(store_factory(cfg)) == 0  # nothing comes back after a restart


def test_check_l2_reports_without_fixing(make_config: MakeConfig) -> None:
    from kvpool_mmap import LayoutMismatchError, check_l2

    cfg = make_config(l1_slots=2, l2_slots=8)
    s = TieredStore(cfg)
    put_chain(s, [0, 1])
    s.close()
    with open(cfg.l2_file(0), "r+b") as fh:  # flip a byte in the first payload
        fh.seek(2 * 4096 + 5)
        b = fh.read(1)
        fh.seek(2 * 4096 + 5)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert check_l2(cfg).bad_payloads == 1
    assert check_l2(cfg).bad_payloads == 1  # fix=False changed nothing
    assert check_l2(cfg, fix=True).bad_payloads == 1
    assert check_l2(cfg).bad_payloads == 0
    with pytest.raises(LayoutMismatchError, match="fingerprint"):
        check_l2(make_config(l1_slots=2, l2_slots=8, fingerprint=b"other"))


def test_load_during_demotion_reads_the_right_bytes(
    make_config: MakeConfig, store_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hazard H7: a block demoted and loaded in the same step must never be read from an
    L2 slot whose write has not completed. Here the load is served from the L1 copy,
    which stays pinned until end_load even though its demotion finishes meanwhile. The
    demotions are held until the load has begun (else a fast disk may finish them first)."""
    s = store_factory(
        make_config(l1_slots=2, l2_slots=8, write_through=False, io_threads=1, l1_overflow="demote")
    )
    put_chain(s, [0, 1])
    demotions = hold_l2_writes(monkeypatch)
    t = s.begin_store([key(5), key(6)])  # evicts 0 and 1: demotions start, no slot yet
    assert t.l1_slots == [None, None]
    load = s.begin_load([key(0), key(1)])  # same "step": the demotions are still running
    assert load.tiers == [Tier.L1, Tier.L1]
    demotions.set()
    settle(s)  # demotions land; the pinned L1 copies must survive
    for i, slot in zip((0, 1), load.l1_slots, strict=True):
        np.testing.assert_array_equal(s.l1_files[0].array[slot], block(i)[0])
    s.end_load(load)  # now the slots free up
    check_invariants(s)
    assert s.lookup([key(0), key(1)]) == [Tier.L2, Tier.L2]
    assert_blocks(s, [0, 1])  # and the promoted copies are right too
    check_invariants(s)


def test_promotions_do_not_queue_behind_write_through(
    make_config: MakeConfig, store_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from kvpool_mmap._io import BlockMover

    s = store_factory(make_config(l1_slots=8, l2_slots=32, io_threads=1))
    put_chain(s, [0, 1, 2, 3])
    settle(s)
    put_chain(s, list(range(4, 12)))  # 0..3 now live in L2 only
    settle(s)
    assert s.lookup([key(0)]) == [Tier.L2]
    slow_write = BlockMover.write_block

    def slow(self: BlockMover, *args: object) -> list[int]:
        time.sleep(1.0)
        return slow_write(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockMover, "write_block", slow)
    put_chain(s, [12, 13, 14])  # three slow write-throughs on the single write thread
    t0 = time.monotonic()
    load = s.begin_load([key(0)])
    assert s.wait_load(load, timeout=5) is LoadStatus.READY
    assert time.monotonic() - t0 < 0.9  # did not wait for even one slow write
    assert s._io is not None
    assert s._io.background > 0
    s.end_load(load)
    settle(s)
    check_invariants(s)


def l1_full_of_hanging_writes(
    make_config: MakeConfig, store_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> tuple[TieredStore, threading.Event]:
    """A 4-slot L1 holding blocks 4..7, whose write-throughs wait for the returned gate;
    blocks 0..3 were evicted to L2 (clean)."""
    s = store_factory(make_config(l1_slots=4, l2_slots=32, io_threads=1))
    put_chain(s, [0, 1, 2, 3])
    settle(s)
    gate = hold_l2_writes(monkeypatch)
    assert put_chain(s, [4, 5, 6, 7]) == 4
    return s, gate


def test_promotion_waits_for_slots_held_by_write_through(
    make_config: MakeConfig, store_factory: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every L1 slot holds a block whose write-through is still in flight when an L2 hit
    arrives. Those blocks are victims like any other; the promotion waits for their
    writes to land instead of failing (on a slow disk it used to be a miss)."""
    s, gate = l1_full_of_hanging_writes(make_config, store_factory, monkeypatch)
    assert s.lookup([key(i) for i in range(4)]) == [Tier.L2] * 4
    load = s.begin_load([key(i) for i in range(4)])
    assert load.failed == []
    assert s.poll_load(load) is LoadStatus.PENDING
    gate.set()
    assert s.wait_load(load, timeout=10) is LoadStatus.READY
    assert load.promotion_seconds > 0  # what a caller's cost model learns the L2 rate from
    for i, slot in enumerate(load.l1_slots):
        np.testing.assert_array_equal(s.l1_files[0].array[slot], block(i)[0])
    s.end_load(load)
    settle(s)
    check_invariants(s)
    # The blocks evicted mid-write reached L2 intact.
    assert s.lookup([key(i) for i in range(4, 8)]) == [Tier.L2] * 4
    assert_blocks(s, [4, 5, 6, 7])
    check_invariants(s)
    l1_only = s.begin_load([key(7)])
    assert l1_only.tiers == [Tier.L1]
    assert l1_only.promotion_seconds == 0
    s.end_load(l1_only)


@pytest.mark.parametrize("pin_all", [False, True])
def test_promotion_never_waits_for_a_slot_a_load_pinned_again(
    make_config: MakeConfig,
    store_factory: Factory,
    monkeypatch: pytest.MonkeyPatch,
    pin_all: bool,
) -> None:
    """A promotion counts on the slot of a victim whose L2 write is in flight; then a
    second load pins that victim (it is still readable in L1). The promotion takes
    another victim, or fails at once when every L1 block is pinned; it used to wait
    until the second load ended, forever if that load waited on the first."""
    s, gate = l1_full_of_hanging_writes(make_config, store_factory, monkeypatch)
    first = s.begin_load([key(0)])
    assert s.poll_load(first) is LoadStatus.PENDING
    (victim,) = [e for e in s._entries.values() if e.evicting]
    pinned = [key(i) for i in range(4, 8)] if pin_all else [victim.key]
    second = s.begin_load(pinned)
    assert second.tiers == [Tier.L1] * len(pinned)
    if pin_all:
        assert s.poll_load(first) is LoadStatus.FAILED
        assert first.failed == [key(0)]
        assert first.promotion_seconds == 0  # no I/O ran: nothing for a cost model to learn
    gate.set()
    assert s.wait_load(first, timeout=10) is (LoadStatus.FAILED if pin_all else LoadStatus.READY)
    if not pin_all:
        np.testing.assert_array_equal(s.l1_files[0].array[first.l1_slots[0]], block(0)[0])
    s.end_load(first)
    s.end_load(second)
    settle(s)
    check_invariants(s)
    assert all(e.l1_pins == 0 and e.l2_pins == 0 for e in s._entries.values())
    assert_blocks(s, list(range(8)))
