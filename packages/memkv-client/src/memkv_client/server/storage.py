"""Server storage: a preallocated block arena, lanes with LRU eviction, pinned reads.

Values of more than `SMALL_MAX` bytes live in fixed-size blocks of one anonymous mmap
allocated at start and pre-faulted in the background, so receiving a value rarely
page-faults fresh memory. Smaller values are plain `bytearray` objects.

**Memory bound.** Each value is charged its blocks, or for a small one its length but at
least `MIN_VALUE_CHARGE`, plus `ITEM_OVERHEAD` and its key's length (the index and
bookkeeping objects). Everything charged outside the arena is backed by arena blocks
that are *lent* out: taken off the free list and returned to the kernel
(`MADV_DONTNEED`). So the arena's resident blocks plus everything outside it never
exceed `capacity` (plus one block), whatever the mix of value sizes. A put that cannot
fit even after evicting every unpinned value evicts nothing.

**Lanes.** A key's namespace is its prefix before the first `/` (the whole key has
namespace `b""` if it holds no `/`); the namespace hashes (CRC-32) onto one of
`lanes` lanes. Each lane has a fair share of `capacity / lanes` and its own LRU
order. A lane may borrow free memory beyond its share; when memory is full, the victim
is the LRU value of the lane itself if it is at or over its share, otherwise of the
lane furthest over its share. So a lane within its share is never evicted by another.

**Lookup leases.** With `lease_s > 0`, an `exists` that finds a value leases it for
`lease_s` seconds (a later `exists` extends the lease): a reader that asked first
finds it when it comes to read. Eviction passes over leased values (moving each to the
MRU end, at most `LEASE_SKIPS` per victim) and takes the first unleased one. Leases are
best effort: if the lane holds nothing else, the LRU leased value is evicted anyway and
counted in the lane's `lease_breaks`, so a lease never makes a write fail.

**Consistency.** Readers *pin* an entry under the lock and read it outside the lock.
An overwrite or eviction unlinks the entry from the index at once but frees its memory
only when the last pin goes, so a reader sees the whole old value or (if it looks
after the unlink) a miss: never partial or mixed data. Index operations (`exists`,
lookups, commits) hold one lock briefly and never wait for eviction I/O: spilling to
disk happens outside the lock.

**Lost spill files.** A spilled value whose file vanished (or was cut short) behind the
server's back is dropped from the index when a read or an `exists` finds out, and
counted in `spill_lost`: it is a miss, never a failed read.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..auth import value_digest
from ..protocol import Status
from .spill import SpillDir

__all__ = ["BLOCK_SIZE", "LEASE_SKIPS", "Entry", "Reservation", "Store", "namespace_of"]

BLOCK_SIZE = 256 << 10
SMALL_MAX = 64 << 10
LEASE_SKIPS = 64  # leased values passed over per eviction before one lease is broken
ITEM_OVERHEAD = 768  #: bytes charged per item for its index and bookkeeping objects (~700 measured)
MIN_VALUE_CHARGE = 64  #: least bytes charged for a small value (a zero-length one too)
SPILL_MIN = 4096  #: smaller victims are dropped, not spilled (a file each would cost more)
_MADV_DONTNEED = 4
_MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_PREFAULT_CHUNK = 16 << 20  # per madvise call (it holds the GIL)


def namespace_of(key: bytes) -> bytes:
    """The lane namespace of a key: everything before the first `/`."""
    cut = key.find(b"/")
    return key[:cut] if cut >= 0 else b""


class Arena:
    """Fixed-size blocks carved from one anonymous mapping (not thread-safe).

    With `prefault`, a background thread faults the mapping in (`MADV_POPULATE_WRITE`,
    which leaves contents alone, so blocks may be in use meanwhile) and the server
    listens at once; where the kernel lacks it, pages fault in on first use.
    """

    def __init__(self, nblocks: int, prefault: bool = True) -> None:
        self.nblocks = nblocks
        self._map = mmap.mmap(-1, max(1, nblocks) * BLOCK_SIZE, flags=_MAP_FLAGS)
        self.view = memoryview(self._map)
        anchor = ctypes.c_char.from_buffer(self._map)
        self.base = ctypes.addressof(anchor)  # for registering the arena with RDMA
        del anchor
        self._free = list(range(nblocks - 1, -1, -1))
        self.lent: list[int] = []
        self.on_prefaulted: Callable[[], None] = lambda: None
        self.prefaulted = 0  # bytes faulted in so far by the background thread
        self._closing = threading.Event()
        self._prefaulter: threading.Thread | None = None
        if prefault:
            self._prefaulter = threading.Thread(
                target=self._prefault, name="memkv-prefault", daemon=True
            )
            self._prefaulter.start()

    def _prefault(self) -> None:
        size = len(self._map)
        for start in range(0, size, _PREFAULT_CHUNK):
            if self._closing.is_set():
                return
            try:
                self._map.madvise(_MADV_POPULATE_WRITE, start, min(_PREFAULT_CHUNK, size - start))
            except OSError:
                return  # an older kernel: pages fault in on first use instead
            self.prefaulted = min(size, start + _PREFAULT_CHUNK)
        self.on_prefaulted()

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def lend(self) -> None:
        """Take a free block out of use and give its pages back to the kernel: it backs
        memory charged outside the arena (small values, bookkeeping)."""
        b = self._free.pop()
        self.lent.append(b)
        with contextlib.suppress(OSError, ValueError):
            self._map.madvise(_MADV_DONTNEED, b * BLOCK_SIZE, BLOCK_SIZE)

    def unlend(self) -> None:
        self._free.append(self.lent.pop())

    def release_lent_pages(self) -> None:
        """Drop the pages of every lent block again (after the pre-faulter touched them)."""
        for b in self.lent:
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(_MADV_DONTNEED, b * BLOCK_SIZE, BLOCK_SIZE)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        out = self._free[-n:]
        del self._free[-n:]
        return out

    def release(self, blocks: Sequence[int]) -> None:
        self._free.extend(blocks)

    def block(self, i: int) -> memoryview:
        return self.view[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]

    def close(self) -> None:
        self._closing.set()
        if self._prefaulter is not None:
            self._prefaulter.join()
        self.view.release()
        self._map.close()


@dataclass(eq=False)
class Entry:
    """One stored value (in memory or spilled); pinned while `refs > 0`."""

    key: bytes
    lane: int
    length: int
    charge: int  # bytes counted against capacity while held in memory
    outside: int = 0  # the part of `charge` not in arena blocks
    blocks: list[int] = field(default_factory=list)
    small: bytearray | None = None
    path: str | None = None  # spilled to this file
    refs: int = 0
    linked: bool = True  # still reachable from the index
    freed: bool = False
    lease_until: float = 0.0  # eviction passes over it until then (monotonic seconds)
    digest: bytes = b""  # BLAKE3 of the value, sent with it on GET


@dataclass(eq=False)
class Reservation:
    """Memory reserved for an incoming value; fill `views` then commit or abort."""

    entry: Entry
    views: list[memoryview]


@dataclass
class LaneStats:
    share: int
    used: int = 0
    items: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    spills: int = 0
    lease_breaks: int = 0
    lru: OrderedDict[bytes, Entry] = field(default_factory=OrderedDict)


class Store:
    """Thread-safe value store (see the module docstring for the rules)."""

    def __init__(
        self,
        capacity: int,
        lanes: int = 4,
        spill: SpillDir | None = None,
        prefault: bool = True,
        wait_timeout: float = 5.0,
        lease_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lanes < 1:
            raise ValueError("lanes must be >= 1")
        if lease_s < 0:
            raise ValueError("lease_s must be >= 0")
        if capacity < lanes * BLOCK_SIZE:
            raise ValueError(f"capacity must be at least lanes x {BLOCK_SIZE} bytes")
        capacity -= capacity % BLOCK_SIZE
        self.capacity = capacity
        self.arena = Arena(capacity // BLOCK_SIZE, prefault)
        self.arena.on_prefaulted = self._after_prefault
        self._outside = 0  # bytes charged outside the arena (backed by lent blocks)
        # charges (all, and the part outside the arena) of the values eviction may take,
        # and of those pinned by readers (evicting them frees nothing until unpinned)
        self._in_lru = [0, 0]
        self._pinned = [0, 0]
        self.lanes = [LaneStats(share=capacity // lanes) for _ in range(lanes)]
        self.max_value = capacity // lanes // BLOCK_SIZE * BLOCK_SIZE
        self.used = 0
        self.spill = spill
        self._index: dict[bytes, Entry] = {}
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._wait = wait_timeout
        self.lease_s = lease_s
        self._clock = clock
        self._disk: OrderedDict[bytes, Entry] = OrderedDict()
        self._spilling: dict[bytes, Entry] = {}  # victims being written out, by key
        self.counters = {
            "puts": 0, "gets": 0, "deletes": 0, "disk_hits": 0, "no_space": 0, "spill_lost": 0,
        }  # fmt: skip

    def lane_of(self, key: bytes) -> int:
        return zlib.crc32(namespace_of(key)) % len(self.lanes)

    # --- reads --------------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Presence of each key; touches LRU order and leases what it finds (`lease_s`).
        Never waits for eviction; a spilled value's file is checked outside the lock."""
        out = []
        spilled: list[tuple[int, Entry]] = []
        with self._lock:
            until = self._clock() + self.lease_s if self.lease_s > 0 else 0.0
            for i, k in enumerate(keys):
                e = self._index.get(k)
                if e is not None:
                    self._touch(e)
                    if until > e.lease_until:
                        e.lease_until = until
                    if e.path is not None:
                        spilled.append((i, e))
                out.append(e is not None or k in self._spilling)
        for i, e in spilled:
            assert self.spill is not None
            assert e.path is not None
            if not self.spill.present(e.path):
                self._lost(e)
                out[i] = False
        return out

    def size(self, key: bytes) -> int | None:
        with self._lock:
            e = self._index.get(key) or self._spilling.get(key)
            return None if e is None else e.length

    def pin(self, key: bytes) -> Entry | None:
        """Look up and pin an entry for reading (caller must `unpin`)."""
        with self._lock:
            e = self._index.get(key)
            lane = self.lanes[self.lane_of(key)]
            if e is None:
                e = self._spilling.get(key)  # being written out: still in memory, readable
                if e is None:
                    lane.misses += 1
                    return None
            else:
                self._touch(e)
            lane.hits += 1
            self.counters["gets"] += 1
            e.refs += 1
            if e.refs == 1 and self._in_lru_now(e):
                _add(self._pinned, e)
            return e

    def unpin(self, e: Entry) -> None:
        with self._lock:
            e.refs -= 1
            if e.refs == 0 and self._in_lru_now(e):
                _add(self._pinned, e, -1)
            if e.refs == 0 and not e.linked:
                self._free(e)

    def _in_lru_now(self, e: Entry) -> bool:
        return e.path is None and self.lanes[e.lane].lru.get(e.key) is e

    def views(self, e: Entry) -> list[memoryview]:
        """The value's bytes as memoryviews (in-memory entries only; pin first)."""
        if e.small is not None:
            return [memoryview(e.small)]
        out = []
        left = e.length
        for b in e.blocks:
            n = min(left, BLOCK_SIZE)
            out.append(self.arena.block(b)[:n])
            left -= n
        return out

    def _touch(self, e: Entry) -> None:
        if e.path is not None:
            self._disk.move_to_end(e.key)
        else:
            self.lanes[e.lane].lru.move_to_end(e.key)

    # --- writes -------------------------------------------------------------------------

    def reserve(self, key: bytes, length: int) -> Reservation | Status:
        """Reserve memory for a value, evicting as needed; returns a status on failure."""
        if length > self.max_value:
            return Status.VALUE_TOO_LARGE
        lane_i = self.lane_of(key)
        small = length <= SMALL_MAX
        nblocks = 0 if small else -(-length // BLOCK_SIZE)
        outside = ITEM_OVERHEAD + len(key) + (max(MIN_VALUE_CHARGE, length) if small else 0)
        charge = nblocks * BLOCK_SIZE + outside
        deadline: float | None = None
        while True:
            to_spill: list[Entry] = []
            with self._lock:
                if self._could_fit(nblocks, outside):
                    status = self._make_room(lane_i, charge, nblocks, outside, to_spill)
                else:
                    status = Status.NO_SPACE  # evicting cannot help now: evict nothing
                if status is Status.OK:
                    self._outside += outside
                    while len(self.arena.lent) < self._blocks_for(self._outside):
                        self.arena.lend()
                    blocks: list[int] = []
                    if nblocks:
                        got = self.arena.alloc(nblocks)
                        assert got is not None, "accounting guarantees free blocks"
                        blocks = got
                    self.used += charge
                    self.lanes[lane_i].used += charge
                    e = Entry(key, lane_i, length, charge, outside, blocks, linked=False)
                    if small:
                        e.small = bytearray(length)
                    return Reservation(e, self.views(e))
                if status is Status.NO_SPACE and not to_spill:
                    now = time.monotonic()
                    deadline = deadline if deadline is not None else now + self._wait
                    if now >= deadline or not self._freed.wait(deadline - now):
                        self.counters["no_space"] += 1
                        return Status.NO_SPACE
                    continue
            self._spill_out(to_spill)

    @staticmethod
    def _blocks_for(outside: int) -> int:
        return -(-outside // BLOCK_SIZE)

    def _fits(self, nblocks: int, outside: int) -> bool:
        """Under the lock: free (and lent) blocks cover `nblocks` more arena blocks and
        `outside` more bytes outside the arena."""
        arena = self.arena
        return nblocks + self._blocks_for(self._outside + outside) <= (
            arena.free_blocks + len(arena.lent)
        )

    def _could_fit(self, nblocks: int, outside: int) -> bool:
        """Under the lock: whether evicting every unpinned value would make room, so a
        put that cannot fit evicts nothing."""
        ev_all = self._in_lru[0] - self._pinned[0]
        ev_outside = self._in_lru[1] - self._pinned[1]
        arena_left = (self.used - self._outside) - (ev_all - ev_outside)
        rest = self._outside - ev_outside + outside
        return arena_left // BLOCK_SIZE + nblocks + self._blocks_for(rest) <= self.arena.nblocks

    def _make_room(
        self, lane_i: int, charge: int, nblocks: int, outside: int, to_spill: list[Entry]
    ) -> Status:
        """Under the lock: evict until the value fits. Victims to spill go to `to_spill`."""
        lane = self.lanes[lane_i]
        while not self._fits(nblocks, outside):
            if lane.used + charge > lane.share and lane.lru:
                victim_lane = lane
            else:
                over = [ln for ln in self.lanes if ln.lru and ln.used > ln.share]
                victim_lane = max(over, key=lambda ln: ln.used - ln.share) if over else lane
            if not victim_lane.lru:
                return Status.NO_SPACE  # everything left is pinned/in flight: wait
            victim = self._pop_victim(victim_lane)
            victim_lane.evictions += 1
            if self.spill is not None and SPILL_MIN <= victim.length <= self.spill.capacity:
                victim.refs += 1  # keep its memory while it is written out
                to_spill.append(victim)
                self._spilling[victim.key] = victim
                self._unlink(victim)
                return Status.NO_SPACE
            self._unlink(victim)
        return Status.OK

    def _pop_victim(self, lane: LaneStats) -> Entry:
        """Under the lock: take the lane's LRU value that holds no lease (see the module
        docstring); after `LEASE_SKIPS` leased ones, the LRU one, lease or not."""
        lru = lane.lru
        if self.lease_s > 0:
            now = self._clock()
            for _ in range(min(LEASE_SKIPS, len(lru))):
                key, e = next(iter(lru.items()))
                if e.lease_until <= now:
                    break
                lru.move_to_end(key)  # leased: a second chance, at the MRU end
            else:
                _, e = next(iter(lru.items()))
                if e.lease_until > now:
                    lane.lease_breaks += 1
        _, victim = lru.popitem(last=False)
        _add(self._in_lru, victim, -1)
        if victim.refs:
            _add(self._pinned, victim, -1)
        return victim

    def commit(self, res: Reservation, digest: bytes | None = None) -> None:
        """Publish a filled reservation, replacing any previous value of the key.

        `digest` is the value's BLAKE3 if the caller has checked it already; otherwise
        it is computed here.
        """
        e = res.entry
        e.digest = value_digest(res.views) if digest is None else digest
        with self._lock:
            self._spilling.pop(e.key, None)  # a spill in flight is now stale
            old = self._index.get(e.key)
            if old is not None:
                self._unlink(old)
            e.linked = True
            self._index[e.key] = e
            lane = self.lanes[e.lane]
            lane.lru[e.key] = e
            _add(self._in_lru, e)
            lane.items += 1
            self.counters["puts"] += 1

    def abort(self, res: Reservation) -> None:
        with self._lock:
            self._free(res.entry)

    def delete(self, key: bytes) -> bool:
        with self._lock:
            spilling = self._spilling.pop(key, None) is not None  # must not come back
            e = self._index.get(key)
            if e is None:
                return spilling
            self._unlink(e)
            self.counters["deletes"] += 1
            return True

    # --- internals (lock held) --------------------------------------------------------

    def _unlink(self, e: Entry) -> None:
        if self._index.get(e.key) is e:
            del self._index[e.key]
        if e.path is not None:
            self._disk.pop(e.key, None)
        else:
            lane = self.lanes[e.lane]
            if lane.lru.get(e.key) is e:
                del lane.lru[e.key]
                _add(self._in_lru, e, -1)
                if e.refs:
                    _add(self._pinned, e, -1)
            lane.items -= 1
        e.linked = False
        if e.refs == 0:
            self._free(e)

    def _free(self, e: Entry) -> None:
        if e.freed:
            return
        e.freed = True
        if e.path is not None:
            assert self.spill is not None
            self.spill.remove(e.path, e.length)
            return
        if e.blocks:
            self.arena.release(e.blocks)
        e.small = None
        self._outside -= e.outside
        while len(self.arena.lent) > self._blocks_for(self._outside) + 1:  # one spare
            self.arena.unlend()
        self.used -= e.charge
        self.lanes[e.lane].used -= e.charge
        self._freed.notify_all()

    # --- spilling (outside the lock) ----------------------------------------------------

    def _spill_out(self, victims: list[Entry]) -> None:
        assert self.spill is not None
        for v in victims:
            path: str | None = None
            try:
                path = self.spill.write(self.views(v), v.length)
            except OSError:
                path = None
            with self._lock:
                current = self._spilling.get(v.key) is v
                if current:
                    del self._spilling[v.key]
                if path is not None and current and v.key not in self._index:
                    d = Entry(v.key, v.lane, v.length, 0, path=path, digest=v.digest)
                    self._index[v.key] = d
                    self._disk[v.key] = d
                    self.lanes[v.lane].spills += 1
                    self._evict_disk()
                elif path is not None:  # rewritten or deleted meanwhile: stale copy
                    self.spill.remove(path, v.length)
                v.refs -= 1
                if v.refs == 0:
                    self._free(v)

    def _evict_disk(self) -> None:
        assert self.spill is not None
        while self.spill.used > self.spill.capacity and self._disk:
            _, victim = self._disk.popitem(last=False)
            self._unlink(victim)

    def _after_prefault(self) -> None:
        with self._lock:
            self.arena.release_lent_pages()

    def open_spilled(self, e: Entry) -> int | None:
        """An fd of a pinned spilled entry (the data stays readable even if it is unlinked
        later), or None if its file is lost: the entry is then dropped (a miss)."""
        assert self.spill is not None
        assert e.path is not None
        fd = self.spill.open(e.path, e.length)
        if fd is None:
            self._lost(e, read=True)
            return None
        self.counters["disk_hits"] += 1
        return fd

    def _lost(self, e: Entry, read: bool = False) -> None:
        """A spilled entry's file vanished: drop it from the index (if still there). A
        `read` that `pin` counted as a hit becomes a miss."""
        with self._lock:
            if read:
                lane = self.lanes[e.lane]
                lane.hits -= 1
                lane.misses += 1
            if self._index.get(e.key) is e:
                self._unlink(e)
                self.counters["spill_lost"] += 1

    # --- reporting ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "capacity": self.capacity,
                "used": self.used,
                "items": len(self._index),
                "max_value": self.max_value,
                "block_size": BLOCK_SIZE,
                "free_blocks": self.arena.free_blocks,
                "prefaulted": self.arena.prefaulted,
                "outside_arena": self._outside,
                "lent_blocks": len(self.arena.lent),
                "counters": dict(self.counters),
                "spill": None
                if self.spill is None
                else {
                    "dir": self.spill.directory,
                    "capacity": self.spill.capacity,
                    "used": self.spill.used,
                    "items": len(self._disk),
                },
                "lanes": [
                    {
                        "lane": i,
                        "share": ln.share,
                        "used": ln.used,
                        "items": ln.items,
                        "hits": ln.hits,
                        "misses": ln.misses,
                        "evictions": ln.evictions,
                        "spills": ln.spills,
                        "lease_breaks": ln.lease_breaks,
                    }
                    for i, ln in enumerate(self.lanes)
                ],
            }

    def close(self) -> None:
        with self._lock:
            self._index.clear()
        if self.spill is not None:
            self.spill.close()


def _add(total: list[int], e: Entry, sign: int = 1) -> None:
    """Add (or with `sign=-1` subtract) an entry's charge and its outside part."""
    total[0] += sign * e.charge
    total[1] += sign * e.outside
