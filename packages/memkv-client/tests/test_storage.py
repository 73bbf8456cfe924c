"""Server storage in-process: lanes, LRU, borrowing, pinned reads, spilling."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from memkv_client.protocol import Status
from memkv_client.server.spill import SpillDir
from memkv_client.server.storage import (
    BLOCK_SIZE,
    ITEM_OVERHEAD,
    MIN_VALUE_CHARGE,
    Reservation,
    Store,
    namespace_of,
)

SLACK = BLOCK_SIZE  # one block backs the small per-item charges of these tests

MB = 1 << 20


def put(store: Store, key: bytes, data: bytes) -> Status:
    res = store.reserve(key, len(data))
    if not isinstance(res, Reservation):
        return res
    pos = 0
    for v in res.views:
        v[:] = data[pos : pos + len(v)]
        pos += len(v)
    store.commit(res)
    return Status.OK


def read(store: Store, key: bytes) -> bytes | None:
    e = store.pin(key)
    if e is None:
        return None
    try:
        return b"".join(bytes(v) for v in store.views(e))
    finally:
        store.unpin(e)


def keys_in_lane(store: Store, lane: int, n: int) -> list[bytes]:
    out, i = [], 0
    while len(out) < n:
        ns = f"ns{i}".encode()
        if store.lane_of(ns + b"/k") == lane:
            out.append(ns)
        i += 1
    return out


def test_namespace_is_prefix_before_first_slash() -> None:
    assert namespace_of(b"model-a/block/1") == b"model-a"
    assert namespace_of(b"flat-key") == b""
    assert namespace_of(b"/x") == b""


def test_round_trip_small_and_block_values() -> None:
    store = Store(8 * MB + SLACK, lanes=1, prefault=False)
    big = bytes(range(256)) * (BLOCK_SIZE // 256 * 3 + 7)
    assert put(store, b"a", b"small") is Status.OK
    assert put(store, b"b", big) is Status.OK
    assert read(store, b"a") == b"small"
    assert read(store, b"b") == big
    assert store.size(b"b") == len(big)
    assert store.exists([b"a", b"zz", b"b"]) == [True, False, True]


def test_lru_eviction_within_a_lane() -> None:
    store = Store(4 * MB + SLACK, lanes=1, prefault=False)
    for i in range(4):
        assert put(store, f"k{i}".encode(), b"x" * MB) is Status.OK
    assert store.exists([b"k0"]) == [True]  # touch k0: k1 is now the LRU
    assert put(store, b"k4", b"y" * MB) is Status.OK
    assert store.exists([b"k0", b"k1", b"k2", b"k3", b"k4"]) == [True, False, True, True, True]
    assert store.stats()["lanes"][0]["evictions"] == 1


def test_lane_within_its_share_is_not_evicted_by_another() -> None:
    store = Store(8 * MB + SLACK, lanes=2, prefault=False)  # share: 4 MiB each
    a, b = keys_in_lane(store, 0, 1)[0], keys_in_lane(store, 1, 1)[0]
    for i in range(2):
        assert put(store, a + f"/{i}".encode(), b"a" * MB) is Status.OK
    for i in range(12):  # lane b borrows the free memory, then evicts only its own values
        assert put(store, b + f"/{i}".encode(), b"b" * MB) is Status.OK
    assert store.exists([a + b"/0", a + b"/1"]) == [True, True]
    lanes = store.stats()["lanes"]
    assert lanes[0]["evictions"] == 0
    assert 6 * MB < lanes[1]["used"] < 6 * MB + 8192  # values plus per-item charges


def test_over_share_lane_is_evicted_first() -> None:
    store = Store(8 * MB + SLACK, lanes=2, prefault=False)
    a, b = keys_in_lane(store, 0, 1)[0], keys_in_lane(store, 1, 1)[0]
    for i in range(8):  # lane a borrows everything
        assert put(store, a + f"/{i}".encode(), b"a" * MB) is Status.OK
    for i in range(4):  # lane b reclaims its share from lane a's LRU end
        assert put(store, b + f"/{i}".encode(), b"b" * MB) is Status.OK
    assert store.exists([a + f"/{i}".encode() for i in range(8)]) == [False] * 4 + [True] * 4
    assert store.stats()["lanes"][0]["evictions"] == 4


def test_value_larger_than_a_lane_share_is_refused() -> None:
    store = Store(8 * MB, lanes=4, prefault=False)
    assert store.max_value == 2 * MB
    assert store.reserve(b"x", 2 * MB + 1) is Status.VALUE_TOO_LARGE


def test_pinned_reader_sees_whole_old_value_across_overwrite() -> None:
    store = Store(4 * MB + SLACK, lanes=1, prefault=False)
    put(store, b"k", b"old" * 100_000)
    e = store.pin(b"k")
    assert e is not None
    put(store, b"k", b"new" * 100_000)  # overwrite while pinned
    for _ in range(3):  # and churn memory so freed blocks would be reused
        put(store, b"other", b"z" * MB)
    assert b"".join(bytes(v) for v in store.views(e)) == b"old" * 100_000
    store.unpin(e)
    assert read(store, b"k") == b"new" * 100_000


def test_evicted_between_lookup_and_read_is_a_miss() -> None:
    store = Store(2 * MB + SLACK, lanes=1, prefault=False)
    put(store, b"k", b"v" * MB)
    assert store.exists([b"k"]) == [True]
    put(store, b"a", b"a" * MB)
    put(store, b"b", b"b" * MB)  # evicts k
    assert store.pin(b"k") is None


def test_memory_pinned_everywhere_gives_no_space() -> None:
    store = Store(2 * MB + SLACK, lanes=1, prefault=False, wait_timeout=0.05)
    put(store, b"a", b"a" * MB)
    put(store, b"b", b"b" * MB)
    pins = [store.pin(b"a"), store.pin(b"b")]
    put(store, b"c", b"c" * MB)  # unlinks a (still pinned), b stays
    assert store.reserve(b"d", 2 * MB) is Status.NO_SPACE
    for e in pins:
        assert e is not None
        store.unpin(e)
    assert put(store, b"d", b"d" * 2 * MB) is Status.OK


def test_aborted_reservation_frees_memory() -> None:
    store = Store(2 * MB + SLACK, lanes=1, prefault=False)
    res = store.reserve(b"x", 2 * MB)
    assert isinstance(res, Reservation)
    assert 2 * MB < store.stats()["used"] < 2 * MB + 8192
    store.abort(res)
    assert store.stats()["used"] == 0
    assert store.exists([b"x"]) == [False]


class BlockingSpill(SpillDir):
    """A spill directory whose writes wait for a signal."""

    def __init__(self, directory: Path, capacity: int) -> None:
        super().__init__(directory, capacity)
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, views: list[memoryview], length: int) -> str:  # type: ignore[override]
        if not self.entered.is_set():  # only the first write waits
            self.entered.set()
            assert self.release.wait(30)
        return super().write(views, length)


def test_exists_never_blocks_on_eviction(tmp_path: Path) -> None:
    spill = BlockingSpill(tmp_path, 64 * MB)
    store = Store(2 * MB + SLACK, lanes=1, spill=spill, prefault=False)
    put(store, b"a", b"a" * MB)
    put(store, b"b", b"b" * MB)
    writer = threading.Thread(target=put, args=(store, b"c", b"c" * MB))
    writer.start()
    assert spill.entered.wait(30)  # the writer is now stuck spilling "a"
    assert store.exists([b"b", b"zz"]) == [True, False]  # returns while the spill is stuck
    assert store.size(b"b") == MB
    # "a", the value being spilled, is no false miss meanwhile
    assert store.exists([b"a"]) == [True]
    assert store.size(b"a") == MB
    assert read(store, b"a") == b"a" * MB
    assert writer.is_alive()
    spill.release.set()
    writer.join(30)
    assert store.exists([b"a", b"b", b"c"]) == [True, True, True]
    e = store.pin(b"a")
    assert e is not None
    assert e.path is not None  # served from the spill file
    store.unpin(e)


@pytest.mark.parametrize("action", ["delete", "overwrite"])
def test_delete_or_overwrite_during_spill_wins(tmp_path: Path, action: str) -> None:
    spill = BlockingSpill(tmp_path, 64 * MB)
    store = Store(2 * MB + SLACK, lanes=1, spill=spill, prefault=False)
    put(store, b"a", b"a" * MB)
    put(store, b"b", b"b" * MB)
    writer = threading.Thread(target=put, args=(store, b"c", b"c" * MB))
    writer.start()
    assert spill.entered.wait(30)  # "a" is being spilled
    if action == "delete":
        assert store.delete(b"a") is True
    else:
        assert put(store, b"a", b"new") is Status.OK
    spill.release.set()
    writer.join(30)
    assert read(store, b"a") == (None if action == "delete" else b"new")
    spilled = store.stats()["spill"]["items"]
    assert spill.flush()
    assert len(list(tmp_path.glob("*.mkv"))) == spilled  # the stale copy of "a" is gone
    assert store.exists([b"b", b"c"]) == [True, True]


def test_spill_capacity_evicts_oldest_file(tmp_path: Path) -> None:
    spill = SpillDir(tmp_path, 2 * MB)
    store = Store(1 * MB + SLACK, lanes=1, spill=spill, prefault=False)
    for i in range(5):
        assert put(store, f"k{i}".encode(), bytes([i]) * MB) is Status.OK
    assert store.exists([f"k{i}".encode() for i in range(5)]) == [False, False, True, True, True]
    assert spill.flush()
    assert len(list(tmp_path.glob("*.mkv"))) == 2


@pytest.mark.parametrize("lanes", [0, 5000])
def test_bad_lane_counts(lanes: int) -> None:
    with pytest.raises(ValueError, match="lanes"):
        Store(4 * MB, lanes=lanes, prefault=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_exists_lease_keeps_a_value_until_it_is_read() -> None:
    clock = FakeClock()
    store = Store(2 * MB + SLACK, lanes=1, prefault=False, lease_s=30, clock=clock)
    put(store, b"k", b"v" * MB)
    put(store, b"o", b"o" * MB)
    assert store.exists([b"k"]) == [True]  # leased until now + 30 s
    assert store.exists([b"o"]) == [True]  # leased too, and now the MRU
    clock.now += 31  # both leases over: plain LRU again
    assert store.exists([b"k"]) == [True]  # k leased and MRU; o (LRU) is not leased
    put(store, b"a", b"a" * MB)  # evicts o
    put(store, b"b", b"b" * MB)  # k is the LRU but leased: evicts a instead
    assert store.exists([b"o", b"a"]) == [False, False]
    assert read(store, b"k") == b"v" * MB
    assert store.stats()["lanes"][0]["lease_breaks"] == 0


def test_lease_is_best_effort_when_everything_is_leased() -> None:
    clock = FakeClock()
    store = Store(2 * MB + SLACK, lanes=1, prefault=False, lease_s=30, clock=clock)
    put(store, b"k", b"v" * MB)
    put(store, b"o", b"o" * MB)
    assert store.exists([b"k", b"o"]) == [True, True]
    assert put(store, b"a", b"a" * MB) is Status.OK  # a write never fails for a lease
    assert store.exists([b"k", b"o", b"a"]) == [False, True, True]  # the LRU one went
    assert store.stats()["lanes"][0]["lease_breaks"] == 1


def test_lease_expires() -> None:
    clock = FakeClock()
    store = Store(2 * MB + SLACK, lanes=1, prefault=False, lease_s=30, clock=clock)
    put(store, b"k", b"v" * MB)
    assert store.exists([b"k"]) == [True]
    put(store, b"o", b"o" * MB)
    clock.now += 30.5
    put(store, b"a", b"a" * MB)  # k's lease is over: k is evicted as the LRU value
    assert store.exists([b"k", b"o"]) == [False, True]
    assert store.stats()["lanes"][0]["lease_breaks"] == 0


def test_a_put_that_cannot_fit_evicts_nothing() -> None:
    store = Store(2 * MB + SLACK, lanes=1, prefault=False, wait_timeout=0.05)
    put(store, b"a", b"a" * MB)
    put(store, b"b", b"b" * MB)
    pin = store.pin(b"a")
    assert pin is not None
    assert store.reserve(b"big", 2 * MB) is Status.NO_SPACE  # a is pinned: cannot fit
    assert store.exists([b"a", b"b"]) == [True, True]  # b was not evicted in vain
    assert store.stats()["lanes"][0]["evictions"] == 0
    store.unpin(pin)


def test_tiny_and_empty_values_are_charged() -> None:
    """Keys, per-item overhead and a minimum per value count against capacity, backed by
    arena blocks lent out: empty values evict once memory is full."""
    store = Store(2 * MB, lanes=1, prefault=False)
    for i in range(20_000):
        assert put(store, b"tiny/%d" % i, b"") is Status.OK
    st = store.stats()
    assert st["items"] < 2 * MB // (ITEM_OVERHEAD + MIN_VALUE_CHARGE)
    assert st["lanes"][0]["evictions"] > 0
    resident = (store.arena.nblocks - st["lent_blocks"]) * BLOCK_SIZE + st["outside_arena"]
    assert resident <= st["capacity"]


def test_spill_dir_touches_only_its_own_files(tmp_path: Path) -> None:
    (tmp_path / "holiday-video.mkv").write_bytes(b"precious")
    with pytest.raises(ValueError, match="not a MemKV spill directory"):
        SpillDir(tmp_path, MB)
    assert (tmp_path / "holiday-video.mkv").read_bytes() == b"precious"
    own = tmp_path / "spill"
    spill = SpillDir(own, MB)  # created and claimed with a marker
    (own / "holiday-video.mkv").write_bytes(b"precious")  # dropped in later
    spill.write([memoryview(b"v")], 1)
    spill.close()
    assert sorted(f.name for f in own.iterdir()) == [".memkv-spill", "holiday-video.mkv"]
    SpillDir(own, MB).close()  # a claimed directory is reused
    assert (own / "holiday-video.mkv").read_bytes() == b"precious"


def test_prefault_runs_in_the_background_so_the_server_listens_at_once() -> None:
    """Pre-faulting 2 GiB in the constructor (MAP_POPULATE) took seconds before the
    server could listen; now a background thread does it and stops on close."""
    t0 = time.monotonic()
    store = Store(2 << 30, lanes=1, prefault=True)
    took = time.monotonic() - t0
    try:
        assert took < 0.25
        assert put(store, b"k", b"v" * MB) is Status.OK  # usable while it runs
        deadline = time.monotonic() + 30
        while store.stats()["prefaulted"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.stats()["prefaulted"] > 0
    finally:
        store.close()
