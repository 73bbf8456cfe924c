"""TieredStore: the index owner. Allocates L1 slots, evicts, demotes, promotes, writes through.

Call sequence (all methods on one owner thread, e.g. vLLM's scheduler; none blocks on I/O
except close/flush/wait_load):

1. lookup(keys) -> tiers of the longest cached prefix (no pins).
2. begin_load(keys) -> LoadTicket: pins the prefix; L2 blocks are promoted into L1 on the
   I/O threads. poll_load(ticket) until READY or FAILED; the worker copies L1 -> GPU from
   ticket.l1_slots; then end_load(ticket) unpins and counts hits.
3. begin_store(keys, parents, depths) -> StoreTicket: pinned L1 slots (None where not
   admitted, already stored, or no space; begin_store says when a key found only in L2
   gets one). The worker writes the slots; then commit_store(ticket) (or abort_store)
   makes them visible and queues the write-through.

Guarantees: a pinned slot (being written by the worker, promoted, loaded) is never evicted;
no slot is reused while anything uses it (an L2 write reading it included: a victim whose
write-through is in flight frees its slot when the write lands, and a promotion waiting
for that slot waits rather than fails); an L2 slot is never read before its write
completed (the index marks it VALID only when the write job has finished); jobs on one L2
slot run in submission order; a promotion whose checksum fails is reported in
ticket.failed, counted, logged, and its L2 copy dropped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from kv_eviction import ChainHeapPolicy
from kv_eviction.retention import Retention

from ._engine import StoreEngine, check_key
from ._index import Entry, SlotState
from ._types import LoadStatus, LoadTicket, StoreStats, StoreTicket, Tier


class TieredStore(StoreEngine):
    """Index owner for one engine (one dp rank, all its tp ranks). See the module docstring.

    TieredStore(config, create_l1=True): create_l1=False attaches to L1 files the workers
    created (vLLM); True creates them (standalone). Opens and recovers L2.

    Threading: every public method must be called from the same thread; I/O runs on the
    store's own threads and is reaped at the start of each call.
    """

    # --- public API -------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[Tier]:
        """Tier of each block of the longest cached prefix of `keys`. Pins nothing."""
        self._reap()
        self._counters["lookups"] += 1
        return self._prefix(keys)

    def _prefix(self, keys: Sequence[bytes]) -> list[Tier]:
        out: list[Tier] = []
        if self._disabled:
            return out
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
        ticket = LoadTicket(
            self._new_id(), list(keys[:n]), tiers, [-1] * n, started=time.monotonic()
        )
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
        retention: Retention = Retention.NORMAL,
    ) -> StoreTicket:
        """Allocate pinned L1 slots for the keys the worker should write.

        Non-blocking. Keys already stored (or in flight) and keys the admission tracker
        rejects get None; so do keys found only in L2 under l1_overflow='demote', while
        'drop_unwritten' gives them an L1 slot again (counted in `restores`; their L2
        copy stays and no L2 write follows), as L1 alone would. L1 victims are dropped if
        already in L2, else demoted (or, under 'drop_unwritten' with L2 writes behind,
        dropped); when no slot can be freed now, the remaining keys get None (their
        prefix still gets slots). Under 'demote' a victim whose L2 write is in flight
        counts as a slot on its way, so the store gets fewer slots now; under
        'drop_unwritten' further victims are taken. parents/depths default to the
        previous key in `keys` and the position. `retention` is the storing request's
        hint for the eviction policies (kv_eviction.retention); LOW keys are never
        written to L2, and keys already stored move up to HIGH when asked.
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
            check_key(k)
            if self._disabled or k in seen:
                continue
            e = self._entries.get(k)
            if e is not None:
                self._raise_retention(e, retention)
            if e is not None and not (self._restores and self._l2_only(e)):
                continue
            seen.add(k)
            if e is None and not self._admission.observe(k):
                self._counters["not_admitted"] += 1
                continue
            want.append(i)
        slots, _ = self._alloc_l1(len(want), wait_for_l2=self.config.l1_overflow == "demote")
        self._counters["store_no_space"] += len(want) - len(slots)
        ticket = StoreTicket(self._new_id(), list(keys), [None] * n, parents, depths)
        for i, slot in zip(want, slots, strict=False):
            e = self._entries.get(keys[i])
            if e is None:
                e = self._entries[keys[i]] = Entry(keys[i], parents[i], depths[i])
                e.retention = retention
            else:
                e.parent = parents[i]
                self._counters["restores"] += 1
            e.l1, e.l1_state = slot, SlotState.WRITING
            ticket.l1_slots[i] = slot
        return ticket

    def raise_retention(self, keys: Sequence[bytes], retention: Retention) -> int:
        """Move each stored key of `keys` held at a lower retention up to `retention` (a
        request asking to keep blocks it found stored); unknown keys are ignored. Returns
        how many moved."""
        found = (self._entries.get(k) for k in keys)
        return sum(self._raise_retention(e, retention) for e in found if e is not None)

    def _raise_retention(self, e: Entry, retention: Retention) -> bool:
        """A request asks to keep a stored key longer: if `retention` is above its own,
        move it up in both policies (True)."""
        if retention <= e.retention:
            return False
        e.retention = retention
        for policy in (self._l1_policy, self._l2_policy):
            if isinstance(policy, ChainHeapPolicy) and e.key in policy:
                policy.set_retention(e.key, retention)
        return True

    @staticmethod
    def _l2_only(e: Entry) -> bool:
        """Only a complete L2 copy exists and nothing is moving it into L1."""
        return e.l1_state == SlotState.NONE and e.l2_readable

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
            self._announce(k, Tier.L1, True)
            if self.l2_files and self.config.write_through and e.l2_state == SlotState.NONE:
                self._queue_write_through(e)
        self._pump()

    def abort_store(self, ticket: StoreTicket) -> None:
        """The worker did not write the slots: free them."""
        if ticket.done:
            return
        ticket.done = True
        for k, slot in ticket.allocated:
            e = self._entries[k]
            e.l1, e.l1_state = -1, SlotState.NONE
            self._l1_free.push(slot)
            self._forget(e)

    def tick(self, n: int = 1) -> None:
        """Advance the policies' clocks, reap finished I/O, start queued write-throughs."""
        self._reap()
        self._ticks += n
        if self._ticks >= self.L1_CHECK_EVERY:
            self._ticks = 0
            self._check_l1_files()
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
            disabled=int(bool(self._disabled)),
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
