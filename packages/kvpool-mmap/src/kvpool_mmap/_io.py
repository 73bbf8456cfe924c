"""Asynchronous block transfers between L1 and L2 on a small thread pool.

`BlockMover` does the I/O of one block for every rank (it never touches the index);
`IoEngine` runs such jobs on threads, keeps jobs on one L2 slot in submission order, and
hands completions back to the owner through `completed()` (submit, then poll).
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._codec import encode_header, payload_checksum
from ._config import FsyncMode
from ._l1 import L1RankFile
from ._l2file import L2RankFile


class BlockMover:
    """Copies one block (all ranks) L1->L2 or L2->L1. Thread-safe for distinct slots."""

    def __init__(self, l1: list[L1RankFile], l2: list[L2RankFile], fsync: FsyncMode) -> None:
        self.l1 = l1
        self.l2 = l2
        self.fsync = fsync
        self.stride = l1[0].stride if l1 else 0
        self._dirty = threading.Event()
        self.bypasses_cache = all(f.direct for f in l2)
        """Payloads move with O_DIRECT: no read is ever served from the page cache."""
        self.cache_dropped_at = float("-inf")
        """Start of the newest sync whose cache drop finished: pages touched before it are gone."""

    def write_block(
        self, l1_slot: int, l2_slot: int, key: bytes, gen: int, depth: int
    ) -> list[int]:
        """Write L1 slot -> L2 slot in every rank file; return the payload checksums.

        Order per rank: invalidate header, payload, [sync], header, [sync]. A crash at any
        point leaves the slot EMPTY or holding exactly this block (see _recovery).
        """
        checksums = []
        always = self.fsync == "always"
        for dst in self.l2:
            dst.invalidate(l2_slot)
        for src, dst in zip(self.l1, self.l2, strict=True):
            data = src.buffer(l1_slot)
            checksum = payload_checksum(data)
            dst.write_payload(l2_slot, data)
            if always:
                dst.sync()
            dst.write_header(l2_slot, encode_header(key, gen, self.stride, checksum, depth))
            if always:
                dst.sync()
            checksums.append(checksum)
        self._dirty.set()
        return checksums

    def read_block(self, l2_slot: int, l1_slot: int, checksums: list[int]) -> bool:
        """Read L2 slot -> L1 slot in every rank file; False if any checksum mismatches."""
        ok = True
        for src, dst, want in zip(self.l2, self.l1, checksums, strict=True):
            buf = dst.buffer(l1_slot)
            src.read_payload(l2_slot, buf)
            if payload_checksum(buf) != want:
                ok = False
        return ok

    def invalidate(self, l2_slot: int) -> None:
        """Mark an L2 slot empty in every rank file."""
        for f in self.l2:
            f.invalidate(l2_slot)
        self._dirty.set()

    def sync(self) -> None:
        """fdatasync every L2 file if something was written since the last sync, then drop
        its cached pages (buffered files only)."""
        if not self._dirty.is_set():
            return
        started = time.monotonic()
        self._dirty.clear()
        for f in self.l2:
            f.sync()
            f.drop_cache()
        self.cache_dropped_at = max(self.cache_dropped_at, started)

    def may_be_cached(self, touched: float) -> bool:
        """Whether a payload last written or read at `touched` (time.monotonic()) may still
        be in the page cache: a read of it then says nothing about the disk's speed.

        Pages written before a sync started are clean when its drop runs, and dropped."""
        return not self.bypasses_cache and touched >= self.cache_dropped_at


@dataclass
class Completion:
    """One finished job: its id and its result or the exception it raised."""

    job: int
    result: Any
    error: BaseException | None
    urgent: bool = False
    finished: float = 0.0
    """time.monotonic() when the job ended (on its I/O thread)."""


class IoEngine:
    """Two thread pools for transfer jobs: `urgent` ones (promotions, which a request waits
    for) never queue behind background ones (write-through, demotion, invalidation).
    Background jobs on the same L2 slot run in submission order; an urgent job only ever
    reads a slot whose writes have completed, so it needs no ordering.

    submit()/completed() are called by the owner thread only; jobs run on the pools.
    """

    def __init__(self, threads: int, mover: BlockMover | None, sync_interval_s: float | None):
        self._pool = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvpool-wr")
        self._urgent = cf.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvpool-rd")
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._tails: dict[int, cf.Future[Any]] = {}
        self.inflight = 0
        self.background = 0
        """Jobs in flight on the background (write) pool."""
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if mover is not None and sync_interval_s is not None:
            self._syncer = threading.Thread(
                target=self._sync_loop,
                args=(mover, sync_interval_s),
                name="kvpool-fsync",
                daemon=True,
            )
            self._syncer.start()

    def _sync_loop(self, mover: BlockMover, interval: float) -> None:
        while not self._stop.wait(interval):
            mover.sync()

    def submit(
        self, job: int, fn: Callable[[], Any], l2_slot: int | None, urgent: bool = False
    ) -> None:
        """Run fn() on a pool; its Completion appears in completed() later."""
        if urgent:
            self._track(job, self._urgent.submit(fn), urgent=True)
            return
        prev = self._tails.get(l2_slot) if l2_slot is not None else None

        def run() -> Any:
            if prev is not None:
                cf.wait([prev])  # submitted earlier, so already running or done: no deadlock
            return fn()

        fut = self._pool.submit(run)
        if l2_slot is not None:
            self._tails[l2_slot] = fut
        self._track(job, fut, urgent=False)

    def _track(self, job: int, fut: cf.Future[Any], urgent: bool) -> None:
        self.inflight += 1
        if not urgent:
            self.background += 1

        def done(f: cf.Future[Any]) -> None:
            err = f.exception()
            result = None if err else f.result()
            self._done.put(Completion(job, result, err, urgent, time.monotonic()))

        fut.add_done_callback(done)

    def completed(self, timeout: float | None = None) -> list[Completion]:
        """Completions since the last call; waits up to `timeout` for the first one."""
        out: list[Completion] = []
        try:
            if timeout is not None and timeout > 0:
                out.append(self._done.get(timeout=timeout))
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        self.inflight -= len(out)
        self.background -= sum(1 for c in out if not c.urgent)
        if out and self._tails:
            self._tails = {s: f for s, f in self._tails.items() if not f.done()}
        return out

    def close(self) -> None:
        """Wait for running jobs and stop the threads."""
        self._stop.set()
        self._urgent.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        if self._syncer is not None:
            self._syncer.join()


def monotonic() -> float:
    """The clock used for waits."""
    return time.monotonic()
