"""TieredStore: the index owner. Allocates L1 slots, evicts, demotes, promotes, writes through.

Call sequence (all methods on one owner thread, e.g. vLLM's scheduler; none blocks on I/O
except close/flush/wait_load):

1. lookup(keys) -> tiers of the longest cached prefix (no pins).
2. begin_load(keys) -> LoadTicket: pins the prefix; L2 blocks are promoted into L1 on the
   I/O threads. poll_load(ticket) until READY or FAILED; the worker copies L1 -> GPU from
   ticket.l1_slots; then end_load(ticket) unpins and counts hits.
3. begin_store(keys, parents, depths) -> StoreTicket: pinned L1 slots (None where not
   admitted, already stored, or no space). The worker writes the slots; then
   commit_store(ticket) (or abort_store) makes them visible and queues the write-through.

Guarantees: a pinned slot (being written, promoted, demoted, loaded) is never evicted or
reused; an L2 slot is never read before its write completed (the index marks it VALID only
when the write job has finished); jobs on one L2 slot run in submission order; a promotion
whose checksum fails is reported in ticket.failed, counted, logged, and its L2 copy dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
from kv_eviction import AdmissionTracker, EvictionPolicy, make_policy

from ._config import MAX_KEY_BYTES, StoreConfig
from ._errors import ConfigError
from ._index import Entry, FreeList, L2Meta, SlotState
from ._io import BlockMover, Completion, IoEngine
from ._l1 import L1RankFile, open_l1_rank
from ._l2file import L2RankFile
from ._recovery import RecoveryReport, recover
from ._types import LoadStatus, LoadTicket, StoreStats, StoreTicket, Tier

log = logging.getLogger("kvpool_mmap")

_WRITE, _READ, _INVALIDATE = "write", "read", "invalidate"


def _policy(config: StoreConfig) -> EvictionPolicy:
    try:
        return make_policy(config.eviction_policy, **dict(config.eviction_options))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"eviction_policy / eviction_options: {exc}") from exc


class TieredStore:
    """Index owner for one engine (one dp rank, all its tp ranks). See the module docstring.

    Threading: every public method must be called from the same thread; I/O runs on the
    store's own threads and is reaped at the start of each call.
    """

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
        self._closed = False

    # --- public API -------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[Tier]:
        """Tier of each block of the longest cached prefix of `keys`. Pins nothing."""
        self._reap()
        self._counters["lookups"] += 1
        return self._prefix(keys)

    def _prefix(self, keys: Sequence[bytes]) -> list[Tier]:
        out: list[Tier] = []
        for k in keys:
            e = self._entries.get(k)
            if e is None:
                break
            if e.l1_readable:
                out.append(Tier.L1)
            elif e.l2_readable:
                out.append(Tier.L2)
            else:
                break
        return out

    def begin_load(self, keys: Sequence[bytes]) -> LoadTicket:
        """Pin the longest cached prefix of `keys` and start promoting its L2 blocks.

        Non-blocking. The ticket covers the prefix found now (possibly shorter than a
        lookup made earlier); blocks that cannot get an L1 slot are in ticket.failed.
        """
        self._reap()
        tiers = self._prefix(keys)
        n = len(tiers)
        entries = [self._entries[k] for k in keys[:n]]
        ticket = LoadTicket(self._new_id(), list(keys[:n]), tiers, [-1] * n)
        pins: list[Entry] = []
        self._ticket_pins[ticket.id] = pins
        promote: list[Entry] = []
        for e, t in zip(entries, tiers, strict=True):
            if t is Tier.L1:
                self._l1_pin(e)
                pins.append(e)
            else:
                self._l2_pin(e)  # keep it from L2 eviction while L1 space is made
                promote.append(e)
        fresh = [e for e in promote if e.l1_state == SlotState.NONE]
        slots, demoting = self._alloc_l1(len(fresh))
        for i, e in enumerate(fresh):
            if i < len(slots):
                self._start_read(e, slots[i])
            elif i < len(slots) + demoting:  # a slot frees when a demotion lands
                e.l1_state = SlotState.FILLING
                self._l2_pin(e)
                self._slot_waiters.append(e)
        for e in promote:
            self._l2_unpin(e)
            if e.l1_state == SlotState.FILLING:
                self._l1_pin(e)
                pins.append(e)
                self._waiters.setdefault(e.key, []).append(ticket)
                ticket.pending += 1
            else:
                ticket.failed.append(e.key)
                self._counters["load_failures"] += 1
        for i, e in enumerate(entries):
            ticket.l1_slots[i] = e.l1
        self._pump()
        return ticket

    def poll_load(self, ticket: LoadTicket) -> LoadStatus:
        """PENDING while promotions run, then READY or FAILED. Non-blocking."""
        self._reap()
        if ticket.pending:
            return LoadStatus.PENDING
        return LoadStatus.FAILED if ticket.failed else LoadStatus.READY

    def wait_load(self, ticket: LoadTicket, timeout: float | None = None) -> LoadStatus:
        """Block until the ticket is done (standalone use; never call it from a scheduler)."""
        assert self._io is not None
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while ticket.pending:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                break
            self._handle(self._io.completed(timeout=left))
        return self.poll_load(ticket)

    def end_load(self, ticket: LoadTicket) -> None:
        """Unpin the ticket's blocks and count the hits. Safe on a pending ticket (cancel)."""
        if ticket.closed:
            return
        self._reap()
        ticket.closed = True
        failed = set(ticket.failed)
        for k, t in zip(ticket.keys, ticket.tiers, strict=True):
            if k in failed or ticket.pending:
                continue
            self._counters["l1_hits" if t is Tier.L1 else "l2_hits"] += 1
            e = self._entries.get(k)
            if e is None:
                continue
            if self._l1_tracked(e):
                self._l1_policy.touch(k)
            if self._l2_policy is not None and e.l2_readable:
                self._l2_policy.touch(k)
        for e in self._ticket_pins.pop(ticket.id, []):
            waiters = self._waiters.get(e.key)
            if waiters and ticket in waiters:
                waiters.remove(ticket)
            self._l1_unpin(e)

    def begin_store(
        self,
        keys: Sequence[bytes],
        parents: Sequence[bytes | None] | None = None,
        depths: Sequence[int] | None = None,
    ) -> StoreTicket:
        """Allocate pinned L1 slots for the keys the worker should write.

        Non-blocking. Keys already stored (or in flight) and keys the admission tracker
        rejects get None; L1 victims are dropped if already in L2, else demoted; when no
        slot can be freed now, the remaining keys get None (their prefix still gets slots).
        parents/depths default to the previous key in `keys` and the position.
        """
        self._reap()
        n = len(keys)
        parents = list(parents) if parents is not None else [None, *keys[:-1]]
        depths = list(depths) if depths is not None else list(range(n))
        if len(parents) != n or len(depths) != n:
            raise ValueError("keys, parents and depths must have the same length")
        want: list[int] = []
        seen: set[bytes] = set()
        for i, k in enumerate(keys):
            _check_key(k)
            if k in self._entries or k in seen:
                continue
            seen.add(k)
            if not self._admission.observe(k):
                self._counters["not_admitted"] += 1
                continue
            want.append(i)
        slots, _ = self._alloc_l1(len(want))
        self._counters["store_no_space"] += len(want) - len(slots)
        ticket = StoreTicket(self._new_id(), list(keys), [None] * n, parents, depths)
        for i, slot in zip(want, slots, strict=False):
            e = Entry(keys[i], parents[i], depths[i])
            e.l1, e.l1_state, e.l1_pins = slot, SlotState.WRITING, 0
            self._entries[keys[i]] = e
            ticket.l1_slots[i] = slot
        return ticket

    def commit_store(self, ticket: StoreTicket) -> None:
        """The worker finished writing the ticket's slots: make them visible, write through."""
        if ticket.done:
            return
        ticket.done = True
        self._reap()
        for k, _slot in ticket.allocated:
            e = self._entries[k]
            e.l1_state = SlotState.VALID
            self._l1_track(e)
            self._counters["stores"] += 1
            if self.l2_files and self.config.write_through:
                self._queue_write_through(e)
        self._pump()

    def abort_store(self, ticket: StoreTicket) -> None:
        """The worker did not write the slots: free them."""
        if ticket.done:
            return
        ticket.done = True
        for k, slot in ticket.allocated:
            e = self._entries.pop(k)
            e.l1_state = SlotState.NONE
            self._l1_free.push(slot)

    def tick(self, n: int = 1) -> None:
        """Advance the policies' clocks, reap finished I/O, start queued write-throughs."""
        self._reap()
        self._l1_policy.tick(n)
        if self._l2_policy is not None:
            self._l2_policy.tick(n)
        self._pump()

    def flush(self, timeout: float | None = None) -> None:
        """Write every committed L1 block that L2 lacks (as far as L2 holds), then wait."""
        if not self.l2_files:
            return
        self._reap()
        for e in list(self._entries.values()):
            if self._l1_tracked(e) and e.l2_state == SlotState.NONE:
                self._queue_write_through(e, force=True)
        self._drain(timeout)
        self._mover.sync()

    def clear(self) -> int:
        """Drop every block that nothing uses (both tiers; L2 headers invalidated).

        For vLLM's reset_prefix_cache. Blocks pinned or in flight stay. Returns the number
        of keys dropped. Blocks until the invalidations are written.
        """
        self._drain(None)
        self._wt_queue.clear()
        dropped = 0
        for e in list(self._entries.values()):
            if e.l1_pins or e.l2_pins or e.evicting:
                continue
            if e.l1_state in (SlotState.WRITING, SlotState.FILLING):
                continue
            if e.l2_state == SlotState.WRITING:
                continue
            if self._l1_tracked(e):
                self._l1_policy.remove(e.key)
                self._free_l1(e)
            if e.l2_readable:
                self._drop_l2(e)
            e.wt_queued = False
            self._forget(e)
            dropped += 1
        self._drain(None)
        return dropped

    def stats(self) -> StoreStats:
        """A snapshot of the counters and gauges."""
        self._reap()
        c = self._counters
        l1_free = len(self._l1_free)
        l2_free = len(self._l2_free)
        return StoreStats(
            l1_slots=self.config.l1_slots,
            l1_used=self.config.l1_slots - l1_free,
            l1_free=l1_free,
            l2_slots=self.config.l2_slots,
            l2_used=self.config.l2_slots - l2_free,
            l2_free=l2_free,
            write_through_queued=len(self._wt_queue),
            inflight_io=self._io.inflight if self._io else 0,
            recovered_blocks=len(self.recovery.blocks),
            recovery_discarded=self.recovery.corrupt_headers
            + self.recovery.incomplete
            + self.recovery.duplicates
            + self.recovery.bad_payloads,
            **c,
        )

    def __len__(self) -> int:
        """Keys with a readable copy in some tier."""
        return sum(1 for e in self._entries.values() if e.l1_readable or e.l2_readable)

    def __contains__(self, key: object) -> bool:
        e = self._entries.get(key) if isinstance(key, bytes) else None
        return e is not None and (e.l1_readable or e.l2_readable)

    def keys(self, tier: Tier | None = None) -> list[bytes]:
        """Keys readable now (from `tier` only, if given)."""
        out = []
        for k, e in self._entries.items():
            if (tier in (None, Tier.L1) and e.l1_readable) or (
                tier in (None, Tier.L2) and e.l2_readable
            ):
                out.append(k)
        return out

    def close(self, flush: bool = True) -> None:
        """Finish in-flight I/O (writing L1-only blocks to L2 first if flush), sync, unmap."""
        if self._closed:
            return
        self._closed = True
        try:
            if flush:
                self.flush()
            else:
                self._wt_queue.clear()
            self._drain(None)
        finally:
            if self._io is not None:
                self._io.close()
            self._close_files(unlink_l1=self._unlink_l1)

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(flush=exc[0] is None)

    # --- synchronous helpers for standalone use (tests, benchmarks) --------------------

    def put(self, keys: Sequence[bytes], blocks: Any) -> int:
        """Store blocks (array-like [n, tp_size, stride] or [n, stride] when tp_size == 1)."""
        data = np.asarray(blocks, dtype=np.uint8).reshape(len(keys), self.config.tp_size, -1)
        ticket = self.begin_store(keys)
        for i, slot in enumerate(ticket.l1_slots):
            if slot is not None:
                for r, f in enumerate(self.l1_files):
                    f.array[slot] = data[i, r]
        self.commit_store(ticket)
        return len(ticket.allocated)

    def get(self, keys: Sequence[bytes], timeout: float | None = 30.0) -> list[np.ndarray]:
        """Copies ([tp_size, stride]) of the longest prefix of `keys` that loads correctly."""
        ticket = self.begin_load(keys)
        try:
            self.wait_load(ticket, timeout)
            n = ticket.ready_prefix if not ticket.pending else 0
            return [
                np.stack([f.array[ticket.l1_slots[i]] for f in self.l1_files]) for i in range(n)
            ]
        finally:
            self.end_load(ticket)

    # --- internals: pins and policy membership -------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _l1_tracked(self, e: Entry) -> bool:
        return e.l1_state == SlotState.VALID and not e.evicting

    def _l1_track(self, e: Entry) -> None:
        self._l1_policy.insert(e.key, e.parent, e.depth)
        if e.l1_pins:
            self._l1_policy.pin(e.key)

    def _l1_pin(self, e: Entry) -> None:
        e.l1_pins += 1
        if e.l1_pins == 1 and self._l1_tracked(e):
            self._l1_policy.pin(e.key)

    def _l1_unpin(self, e: Entry) -> None:
        e.l1_pins -= 1
        assert e.l1_pins >= 0
        if e.l1_pins == 0:
            if self._l1_tracked(e):
                self._l1_policy.unpin(e.key)
            elif e.evicting and e.l2_state != SlotState.WRITING:
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

    def _free_l1(self, e: Entry) -> None:
        self._l1_free.push(e.l1)
        e.l1, e.l1_state, e.evicting = -1, SlotState.NONE, False

    def _forget(self, e: Entry) -> None:
        if e.empty and self._entries.get(e.key) is e:
            del self._entries[e.key]

    # --- internals: allocation and eviction ----------------------------------------

    def _alloc_l1(self, n: int) -> tuple[list[int], int]:
        """Up to n free L1 slots now, and how many demotions were started to free more."""
        out: list[int] = []
        demoting = 0
        while len(out) < n:
            if len(self._l1_free):
                out.append(self._l1_free.pop())
                continue
            need = n - len(out) - demoting
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
        self._l2_pin(e)
        fn = partial(self._mover.read_block, e.l2, slot, self._meta.get(e.l2))
        self._submit(_READ, e, e.l2, fn, urgent=True)

    def _serve_slot_waiters(self) -> None:
        """Give L1 slots freed by demotions to promotions waiting for one."""
        while self._slot_waiters and len(self._l1_free):
            e = self._slot_waiters.popleft()
            self._l2_unpin(e)  # _start_read takes the job's pin
            self._start_read(e, self._l1_free.pop())

    def _evict_l1(self, e: Entry) -> int:
        """Evict a popped L1 victim; 1 if its slot frees later (demotion), else 0."""
        self._counters["l1_evictions"] += 1
        if not self.l2_files or e.l2_readable:
            self._free_l1(e)
            self._forget(e)
            return 0
        slot = self._alloc_l2()
        if slot is None:
            self._free_l1(e)
            self._forget(e)
            return 0
        e.evicting = True
        self._counters["demotions"] += 1
        self._start_write(e, slot)
        return 1

    def _alloc_l2(self) -> int | None:
        if len(self._l2_free):
            return self._l2_free.pop()
        assert self._l2_policy is not None
        victims = self._l2_policy.pop_victims(1)
        if not victims:
            return None
        e = self._entries[victims[0]]  # type: ignore[index]
        self._counters["l2_evictions"] += 1
        slot = e.l2
        e.l2, e.l2_state = -1, SlotState.NONE
        self._forget(e)
        return slot  # the next write on it invalidates the old header first

    def _drop_l2(self, e: Entry) -> None:
        """Forget a bad L2 copy now and invalidate its header in the background."""
        if self._l2_policy is not None and e.l2_readable and e.key in self._l2_policy:
            self._l2_policy.remove(e.key)
        slot = e.l2
        e.l2, e.l2_state = -1, SlotState.NONE
        self._submit(_INVALIDATE, None, slot, partial(self._mover.invalidate, slot))
        self._l2_free.push(slot)  # later jobs on this slot run after the invalidation

    def _queue_write_through(self, e: Entry, force: bool = False) -> None:
        if e.wt_queued:
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
        self._l1_pin(e)
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
        import time

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
            assert self._l2_policy is not None
            self._l2_policy.insert(e.key, e.parent, e.depth)
            if e.l2_pins:
                self._l2_policy.pin(e.key)
        else:
            e.l2_state = SlotState.VALID  # so _drop_l2 treats it uniformly
            e.l2 = slot
            self._drop_l2(e)
        self._l1_unpin(e)

    def _read_done(self, e: Entry, c: Completion) -> None:
        waiters = self._waiters.pop(e.key, [])
        ok = c.error is None and bool(c.result)
        if ok:
            e.l1_state = SlotState.VALID
            self._l1_track(e)
            self._counters["promotions"] += 1
        else:
            if c.error is None:
                self._counters["checksum_failures"] += 1
                log.warning(
                    "kvpool: L2 slot %d (key %s) failed its checksum; treated as a miss",
                    e.l2,
                    e.key.hex(),
                )
            self._counters["load_failures"] += len(waiters)
            self._free_l1(e)
            self._drop_l2(e)
        self._l2_unpin(e)
        for t in waiters:
            t.pending -= 1
            if not ok:
                t.failed.append(e.key)
            else:
                t.l1_slots[t.keys.index(e.key)] = e.l1
        self._forget(e)

    def _close_files(self, unlink_l1: bool) -> None:
        for f in self.l2_files:
            f.close()
        for g in self.l1_files:
            g.close(unlink=unlink_l1)


def _check_key(key: object) -> None:
    if not isinstance(key, bytes):
        raise TypeError(f"keys must be bytes, got {type(key).__name__}")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key is {len(key)} bytes; at most {MAX_KEY_BYTES} are supported")
