"""The store's mechanism: index state, pins, allocation, eviction, demotion, write-through,
and the hand-off of L1<->L2 transfers to the I/O threads and of their completions back.

`TieredStore` (in _store) adds the public API on top. Everything here runs on the owner
thread; only BlockMover's methods run on the I/O threads.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from kv_eviction import AdmissionTracker, EvictionPolicy, make_policy
from kv_eviction.retention import Retention

from ._config import MAX_KEY_BYTES, StoreConfig
from ._errors import ConfigError
from ._index import Entry, FreeList, L2Meta, SlotState
from ._io import BlockMover, Completion, IoEngine
from ._l1 import L1RankFile, open_l1_rank
from ._l2file import L2RankFile
from ._recovery import RecoveryReport, recover
from ._types import LoadTicket, Tier

log = logging.getLogger("kvpool_mmap")

_WRITE, _READ, _INVALIDATE = "write", "read", "invalidate"

TierListener = Callable[[bytes, Tier, bool], None]
"""Called as (key, tier, loadable) when a key becomes loadable from a tier (a committed
store or promotion into L1, a finished L2 write) and when it stops being (evicted,
dropped, cleared, failed its checksum); in order, on the owner thread."""


def _policy(config: StoreConfig) -> EvictionPolicy:
    """A fresh policy per tier; `StoreConfig` validated the name and options."""
    return make_policy(config.eviction_policy, **dict(config.eviction_options))


class StoreEngine:
    """Index state and the mechanics of moving blocks between tiers (no public API)."""

    def __init__(self, config: StoreConfig, create_l1: bool = True) -> None:
        self.config = config
        self._counters: dict[str, int] = dict.fromkeys(
            [
                "lookups",
                "l1_hits",
                "l2_hits",
                "stores",
                "not_admitted",
                "store_no_space",
                "promotions",
                "demotions",
                "write_throughs",
                "write_through_skipped",
                "l1_evictions",
                "l2_evictions",
                "checksum_failures",
                "io_errors",
                "load_failures",
                "dropped_unwritten",
                "restores",
            ],
            0,
        )
        self._l1_policy = _policy(config)
        self._l2_policy = _policy(config) if config.l2 is not None else None
        try:
            self._admission = AdmissionTracker(
                threshold=config.admission_threshold,
                max_entries=max(2, config.admission_max_entries),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        self.l1_files: list[L1RankFile] = []
        self.l2_files: list[L2RankFile] = []
        self._io: IoEngine | None = None
        try:
            for rank in range(config.tp_size):
                self.l1_files.append(open_l1_rank(config, rank, create=create_l1))
            if config.l2 is not None:
                for rank in range(config.tp_size):
                    self.l2_files.append(L2RankFile(config, rank))
        except BaseException:
            self._close_files(unlink_l1=create_l1)
            raise
        self._unlink_l1 = create_l1
        self.tier_listener: TierListener | None = None
        """Told of every change of what each tier can load (`TierListener`); None: off."""
        self._entries: dict[bytes, Entry] = {}
        self._l1_free = FreeList(config.l1_slots)
        self._meta = L2Meta(config.l2_slots, config.tp_size)
        self.recovery = RecoveryReport()
        used: set[int] = set()
        if self.l2_files:
            self.recovery = recover(self.l2_files, config.stride, verify=config.verify_on_open)
            assert self._l2_policy is not None
            for b in self.recovery.blocks:
                e = Entry(b.key, None, b.depth)
                e.l2, e.l2_state = b.slot, SlotState.VALID
                if config.verify_on_open:  # its payload was just read
                    e.l2_touched = time.monotonic()
                self._entries[b.key] = e
                self._meta.set(b.slot, b.checksums)
                self._l2_policy.insert(b.key, None, b.depth)
                used.add(b.slot)
            if self.recovery.blocks:
                log.info("kvpool: recovered %d L2 blocks", len(self.recovery.blocks))
        self._l2_free = FreeList(config.l2_slots, used)
        self._gen = self.recovery.max_generation + 1
        self._mover = BlockMover(self.l1_files, self.l2_files, config.l2_fsync)
        interval = config.fsync_interval_s if self.l2_files and config.l2_fsync == "batch" else None
        self._io = IoEngine(config.io_threads, self._mover if self.l2_files else None, interval)
        self._jobs: dict[int, tuple[str, Entry | None, int]] = {}
        self._next_id = 1
        self._waiters: dict[bytes, list[LoadTicket]] = {}
        self._ticket_pins: dict[int, list[Entry]] = {}
        self._wt_queue: deque[Entry] = deque()
        self._slot_waiters: deque[Entry] = deque()
        self._evicting: set[Entry] = set()
        """L1 victims whose slot frees once an L2 write (and any pin) lets go of it."""
        self._restores = config.l1_overflow == "drop_unwritten"
        """begin_store gives L1 slots to keys found only in L2 (L1 works as it would alone)."""
        self._closed = False
        self._ticks = 0
        self._disabled = ""
        """Why the cache is off (an L1 file was replaced under the store); empty if on."""
        self._check_l1_files()

    # --- internals: pins and policy membership -------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _l1_tracked(self, e: Entry) -> bool:
        return e.l1_state == SlotState.VALID and not e.evicting

    def _l1_track(self, e: Entry) -> None:
        if e.retention == Retention.NORMAL:  # a policy of our API's first version also works
            self._l1_policy.insert(e.key, e.parent, e.depth)
        else:
            self._l1_policy.insert(e.key, e.parent, e.depth, retention=e.retention)
        if e.l1_pins:
            self._l1_policy.pin(e.key)

    def _l1_pin(self, e: Entry) -> None:
        e.l1_pins += 1
        if e.l1_pins == 1 and self._l1_tracked(e):
            self._l1_policy.pin(e.key)

    def _l1_unpin(self, e: Entry) -> None:
        e.l1_pins -= 1
        assert e.l1_pins >= 0
        if e.l1_pins == 0 and self._l1_tracked(e):
            self._l1_policy.unpin(e.key)
        self._release_l1(e)

    def _end_l1_job(self, e: Entry) -> None:
        """An L2 write that read e's L1 slot finished."""
        e.l1_jobs -= 1
        assert e.l1_jobs >= 0
        self._release_l1(e)

    def _release_l1(self, e: Entry) -> None:
        """Free an evicted entry's L1 slot once no pin or L2 write holds it."""
        if e.evicting and e.l1_pins == 0 and e.l1_jobs == 0:
            self._free_l1(e)
        self._forget(e)

    def _l2_pin(self, e: Entry) -> None:
        e.l2_pins += 1
        if e.l2_pins == 1 and e.l2_readable and self._l2_policy is not None:
            self._l2_policy.pin(e.key)

    def _l2_unpin(self, e: Entry) -> None:
        e.l2_pins -= 1
        assert e.l2_pins >= 0
        if e.l2_pins == 0 and e.l2_readable and self._l2_policy is not None:
            self._l2_policy.unpin(e.key)
        self._forget(e)

    def _announce(self, key: bytes, tier: Tier, loadable: bool) -> None:
        if self.tier_listener is not None:
            self.tier_listener(key, tier, loadable)

    def _free_l1(self, e: Entry) -> None:
        if e.l1_state == SlotState.VALID:
            self._announce(e.key, Tier.L1, False)
        self._l1_free.push(e.l1)
        e.l1, e.l1_state, e.evicting = -1, SlotState.NONE, False
        self._evicting.discard(e)

    def _free_l1_later(self, e: Entry) -> int:
        """Mark a victim whose slot an L2 write still reads; the slot frees when it lands."""
        e.evicting = True
        self._evicting.add(e)
        return 1

    def _forget(self, e: Entry) -> None:
        if e.empty and self._entries.get(e.key) is e:
            del self._entries[e.key]

    L1_CHECK_EVERY = 256
    """tick() checks every this many ticks that the L1 files are still the mapped ones."""

    def _check_l1_files(self) -> None:
        """Turn the cache off (fail safe) if a worker re-created its L1 file after we
        attached: the store would otherwise promote into memory the worker never sees,
        and hand out slots the worker writes elsewhere."""
        if self._disabled:
            return
        stale = [str(f.path) for f in self.l1_files if f.replaced()]
        if stale:
            self._disabled = f"L1 file(s) re-created after the store attached: {stale}"
            log.error("kvpool: %s; offloading is off until the engine restarts", self._disabled)

    # --- internals: allocation and eviction ----------------------------------------

    def _alloc_l1(self, n: int, wait_for_l2: bool = True) -> tuple[list[int], int]:
        """Up to n free L1 slots now, and how many victims free theirs later (an L2 write
        lands). With wait_for_l2 those count towards n; without, more victims are taken
        instead, so the slots come now whenever anything is evictable."""
        out: list[int] = []
        demoting = 0
        while len(out) < n:
            if len(self._l1_free):
                out.append(self._l1_free.pop())
                continue
            need = n - len(out) - (demoting if wait_for_l2 else 0)
            if need <= 0:
                break
            victims = self._l1_policy.pop_victims(need)
            if not victims:
                break
            for k in victims:
                demoting += self._evict_l1(self._entries[k])  # type: ignore[index]
        return out, demoting

    def _start_read(self, e: Entry, slot: int) -> None:
        """Promote e's L2 copy into L1 slot `slot` (the job holds one L2 pin)."""
        e.l1, e.l1_state = slot, SlotState.FILLING
        e.l2_read_cached = self._mover.may_be_cached(e.l2_touched)
        self._l2_pin(e)
        fn = partial(self._mover.read_block, e.l2, slot, self._meta.get(e.l2))
        self._submit(_READ, e, e.l2, fn, urgent=True)

    def _serve_slot_waiters(self) -> None:
        """Give free L1 slots to promotions waiting for one, and keep a slot on its way
        for every other waiter or fail it.

        A slot is on its way when its block was evicted and only an L2 write holds it.
        A load may pin such a block again after a waiter counted on its slot; then the
        waiter gets a new victim, or fails (a miss) when every L1 block is pinned: a
        promotion never waits for some load to end, which could be its own ticket.
        """
        while self._slot_waiters and len(self._l1_free):
            self._serve(self._slot_waiters.popleft(), self._l1_free.pop())
        if not self._slot_waiters:
            return
        short = len(self._slot_waiters) - sum(1 for v in self._evicting if v.l1_pins == 0)
        if short <= 0:
            return
        slots, demoting = self._alloc_l1(short)
        for slot in slots:
            self._serve(self._slot_waiters.popleft(), slot)
        for _ in range(short - len(slots) - demoting):
            self._fail_waiter(self._slot_waiters.pop())

    def _serve(self, e: Entry, slot: int) -> None:
        self._l2_unpin(e)  # _start_read takes the job's pin
        self._start_read(e, slot)

    def _fail_waiter(self, e: Entry) -> None:
        e.l1_state = SlotState.NONE
        self._l2_unpin(e)
        self._notify_loads(e, ok=False, finished=0.0)  # no I/O ran: not a promotion time

    def _evict_l1(self, e: Entry) -> int:
        """Evict a popped L1 victim; 1 if its slot frees later (an L2 write lands), else 0."""
        self._counters["l1_evictions"] += 1
        if e.l1_jobs:  # its write-through is in flight: the slot frees when that lands
            return self._free_l1_later(e)
        slot = None
        if self.l2_files and not e.l2_readable and e.retention != Retention.LOW:
            if self._l2_writes_behind():
                self._counters["dropped_unwritten"] += 1
            else:
                slot = self._alloc_l2()
        if slot is None:
            self._free_l1(e)
            self._forget(e)
            return 0
        self._counters["demotions"] += 1
        self._start_write(e, slot)
        return self._free_l1_later(e)

    def _l2_writes_behind(self) -> bool:
        """Under 'drop_unwritten': true while max_inflight_io background L2 writes are
        in flight, i.e. a demotion now would hold its L1 slot behind a disk backlog."""
        assert self._io is not None
        return (
            self.config.l1_overflow == "drop_unwritten"
            and self._io.background >= self.config.max_inflight_io
        )

    def _alloc_l2(self) -> int | None:
        if len(self._l2_free):
            return self._l2_free.pop()
        assert self._l2_policy is not None
        victims = self._l2_policy.pop_victims(1)
        if not victims:
            return None
        e = self._entries[victims[0]]  # type: ignore[index]
        self._counters["l2_evictions"] += 1
        self._announce(e.key, Tier.L2, False)
        slot = e.l2
        e.l2, e.l2_state = -1, SlotState.NONE
        self._forget(e)
        return slot  # the next write on it invalidates the old header first

    def _drop_l2(self, e: Entry) -> None:
        """Forget a bad L2 copy now and invalidate its header in the background."""
        if e.l2_readable:
            self._announce(e.key, Tier.L2, False)
        if self._l2_policy is not None and e.l2_readable and e.key in self._l2_policy:
            self._l2_policy.remove(e.key)
        slot = e.l2
        e.l2, e.l2_state = -1, SlotState.NONE
        self._submit(_INVALIDATE, None, slot, partial(self._mover.invalidate, slot))
        self._l2_free.push(slot)  # later jobs on this slot run after the invalidation

    def _queue_write_through(self, e: Entry, force: bool = False) -> None:
        if e.wt_queued or e.retention == Retention.LOW:
            return
        if not force and len(self._wt_queue) >= self.config.write_through_queue:
            self._counters["write_through_skipped"] += 1
            return
        e.wt_queued = True
        self._wt_queue.append(e)

    def _pump(self) -> None:
        """Start queued write-throughs while the I/O queue has room."""
        assert self._io is not None
        while self._wt_queue and self._io.background < self.config.max_inflight_io:
            e = self._wt_queue.popleft()
            e.wt_queued = False
            if self._entries.get(e.key) is not e or not self._l1_tracked(e):
                continue
            if e.l2_state != SlotState.NONE:
                continue
            slot = self._alloc_l2()
            if slot is None:
                self._counters["write_through_skipped"] += 1
                continue
            self._counters["write_throughs"] += 1
            self._start_write(e, slot)

    def _start_write(self, e: Entry, l2_slot: int) -> None:
        gen = self._gen
        self._gen += 1
        e.l2, e.l2_state = l2_slot, SlotState.WRITING
        e.l1_jobs += 1
        fn = partial(self._mover.write_block, e.l1, l2_slot, e.key, gen, e.depth)
        self._submit(_WRITE, e, l2_slot, fn)

    def _submit(
        self, kind: str, e: Entry | None, l2_slot: int, fn: Any, urgent: bool = False
    ) -> None:
        assert self._io is not None
        job = self._new_id()
        self._jobs[job] = (kind, e, l2_slot)
        self._io.submit(job, fn, l2_slot, urgent)

    # --- internals: completions -----------------------------------------------------

    def _reap(self) -> None:
        if self._io is not None and self._io.inflight:
            self._handle(self._io.completed())
        elif self._slot_waiters:
            self._serve_slot_waiters()

    def _drain(self, timeout: float | None) -> None:
        assert self._io is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._io.inflight or self._wt_queue:
            if deadline is not None and time.monotonic() > deadline:
                break
            self._pump()
            if self._io.inflight:
                self._handle(self._io.completed(timeout=0.05))

    def _handle(self, done: list[Completion]) -> None:
        for c in done:
            kind, e, slot = self._jobs.pop(c.job)
            if c.error is not None:
                self._counters["io_errors"] += 1
                log.error("kvpool: %s job on L2 slot %d failed: %r", kind, slot, c.error)
            if kind == _WRITE:
                assert e is not None
                self._write_done(e, slot, c)
            elif kind == _READ:
                assert e is not None
                self._read_done(e, c)
        self._serve_slot_waiters()

    def _write_done(self, e: Entry, slot: int, c: Completion) -> None:
        if c.error is None:
            self._meta.set(slot, c.result)
            e.l2_state = SlotState.VALID
            e.l2_touched = c.finished
            assert self._l2_policy is not None
            if e.retention == Retention.NORMAL:
                self._l2_policy.insert(e.key, e.parent, e.depth)
            else:
                self._l2_policy.insert(e.key, e.parent, e.depth, retention=e.retention)
            if e.l2_pins:
                self._l2_policy.pin(e.key)
            self._announce(e.key, Tier.L2, True)
        else:
            e.l2_state = SlotState.VALID  # so _drop_l2 treats it uniformly
            e.l2 = slot
            self._drop_l2(e)
        self._end_l1_job(e)

    def _read_done(self, e: Entry, c: Completion) -> None:
        ok = c.error is None and bool(c.result)
        e.l2_touched = c.finished
        if ok:
            e.l1_state = SlotState.VALID
            self._l1_track(e)
            self._counters["promotions"] += 1
            self._announce(e.key, Tier.L1, True)
        else:
            if c.error is None:
                self._counters["checksum_failures"] += 1
                log.warning(
                    "kvpool: L2 slot %d (key %s) failed its checksum; treated as a miss",
                    e.l2,
                    e.key.hex(),
                )
            self._free_l1(e)
            self._drop_l2(e)
        self._l2_unpin(e)
        self._notify_loads(e, ok, c.finished)
        self._forget(e)

    def _notify_loads(self, e: Entry, ok: bool, finished: float) -> None:
        """Tell the tickets waiting for e's promotion that it ended."""
        waiters = self._waiters.pop(e.key, [])
        if not ok:
            self._counters["load_failures"] += len(waiters)
        for t in waiters:
            t.pending -= 1
            t.promoted_at = max(t.promoted_at, finished)
            if ok and e.l2_read_cached:
                t.cached_promotions += 1
            if not ok:
                t.failed.append(e.key)
            else:
                t.l1_slots[t.keys.index(e.key)] = e.l1

    def _close_files(self, unlink_l1: bool) -> None:
        for f in self.l2_files:
            f.close()
        for g in self.l1_files:
            g.close(unlink=unlink_l1)


def check_key(key: object) -> None:
    """TypeError/ValueError unless key is bytes of at most MAX_KEY_BYTES."""
    if not isinstance(key, bytes):
        raise TypeError(f"keys must be bytes, got {type(key).__name__}")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key is {len(key)} bytes; at most {MAX_KEY_BYTES} are supported")
