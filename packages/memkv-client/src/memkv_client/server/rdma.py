"""Server-side RDMA: the store's arena registered once, one `RdmaPeer` per
connection serving RDMA_PUT / RDMA_GET / RDMA_XFER with one-sided verbs.

The client side (queue-pair bootstrap, staging) is `memkv_client.rdma`; the two
meet only in `memkv_client.protocol` and `memkv_client.verbs`.
"""

from __future__ import annotations

import itertools
import os

from .. import protocol as p
from ..protocol import Status
from ..verbs import MemoryRegion, PinnedBuffer, QueuePair, VerbsBackend
from .storage import BLOCK_SIZE, Entry, Reservation, Store

__all__ = ["RdmaPeer", "RdmaResponder"]

_wr_ids = itertools.count(1)


class RdmaResponder:
    """Server-side RDMA: the store's arena registered once; a peer per connection."""

    def __init__(self, backend: VerbsBackend, store: Store, timeout: float = 10.0) -> None:
        self.backend = backend
        self.store = store
        self.timeout = timeout
        arena = store.arena
        self.arena_mr = backend.register(arena.base, arena.nblocks * BLOCK_SIZE)

    def accept(self, endpoint: bytes) -> tuple[RdmaPeer, bytes]:
        qp = self.backend.create_qp()
        try:
            qp.connect(endpoint)
        except Exception as exc:
            qp.close()
            raise p.FrameError(Status.INVALID_REQUEST, f"RDMA connect failed: {exc}") from None
        return RdmaPeer(self, qp), qp.endpoint()

    def close(self) -> None:
        self.backend.deregister(self.arena_mr)
        self.backend.close()


class RdmaPeer:
    """One connection's queue pair: serves RDMA_PUT / RDMA_GET with one-sided verbs."""

    BOUNCE = 1 << 20

    def __init__(self, responder: RdmaResponder, qp: QueuePair) -> None:
        self.r = responder
        self.qp = qp
        self._bounce: PinnedBuffer | None = None

    @property
    def bounce(self) -> PinnedBuffer:
        if self._bounce is None:
            self._bounce = PinnedBuffer(self.r.backend, self.BOUNCE)
        return self._bounce

    def _segments(self, e: Entry, offset: int = 0, n: int | None = None) -> list[tuple[int, int]]:
        """(local address, length) of bytes `[offset, +n)` of an in-arena entry."""
        base = self.r.store.arena.base
        pos = offset
        end = e.length if n is None else offset + n
        segs = []
        while pos < end:
            inner = pos % BLOCK_SIZE
            k = min(BLOCK_SIZE - inner, end - pos)
            segs.append((base + e.blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + inner, k))
            pos += k
        return segs

    WINDOW = 128  # work requests in flight per queue pair (well below its depth)

    def _run(self, posts: list[tuple[bool, MemoryRegion, int, int, int, int]]) -> bool:
        """Post (is_write, mr, addr, n, raddr, rkey) requests in windows; True if all ok."""
        for start in range(0, len(posts), self.WINDOW):
            ids = []
            for is_write, mr, addr, n, raddr, rkey in posts[start : start + self.WINDOW]:
                wr = next(_wr_ids)
                ids.append(wr)
                post = self.qp.post_write if is_write else self.qp.post_read
                post(wr, mr, addr, n, raddr, rkey)
            done = self.qp.wait(ids, self.r.timeout)
            if len(done) != len(ids) or not all(c.ok for c in done):
                return False
        return True

    def serve_put(self, store: Store, items: list[tuple[bytes, int, int, int]]) -> list[int]:
        codes: list[int] = []
        for key, n, raddr, rkey in items:
            res = store.reserve(key, n)
            if not isinstance(res, Reservation):
                codes.append(res)
                continue
            try:
                ok = self._read_range(res, 0, n, raddr, rkey)
            except BaseException:
                store.abort(res)
                raise
            if ok:
                store.commit(res)
                codes.append(Status.OK)
            else:
                store.abort(res)
                codes.append(Status.TRANSFER_FAILED)
        return codes

    def serve_get(
        self, store: Store, items: list[tuple[bytes, int, int, int]]
    ) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for key, n, raddr, rkey in items:
            e = store.pin(key)
            if e is None:
                out.append((Status.NOT_FOUND, 0))
                continue
            try:
                if e.length != n:
                    out.append((Status.SIZE_MISMATCH, e.length))
                    continue
                status = self._write_entry(store, e, raddr, rkey)
                out.append((status, 0 if status is Status.NOT_FOUND else n))
            finally:
                store.unpin(e)
        return out

    def _write_entry(self, store: Store, e: Entry, raddr: int, rkey: int) -> Status:
        return self._write_range(store, e, 0, e.length, raddr, rkey)

    def _write_range(
        self, store: Store, e: Entry, offset: int, n: int, raddr: int, rkey: int
    ) -> Status:
        """RDMA WRITE bytes `[offset, +n)` of a pinned entry to `raddr`: OK,
        TRANSFER_FAILED, or NOT_FOUND if the entry's spill file is lost."""
        if n == 0:
            return Status.OK
        if e.path is None and e.small is None:
            posts, off = [], 0
            for addr, seg in self._segments(e, offset, n):
                posts.append((True, self.r.arena_mr, addr, seg, raddr + off, rkey))
                off += seg
            return _ok(self._run(posts))
        b = self.bounce
        if e.small is not None:
            b.view[:n] = e.small[offset : offset + n]
            return _ok(self._run([(True, b.mr, b.addr, n, raddr, rkey)]))
        fd = store.open_spilled(e)
        if fd is None:
            return Status.NOT_FOUND
        try:
            off = 0
            while off < n:
                k = os.preadv(fd, [b.view[: min(self.BOUNCE, n - off)]], offset + off)
                if k <= 0 or not self._run([(True, b.mr, b.addr, k, raddr + off, rkey)]):
                    return Status.TRANSFER_FAILED
                off += k
        finally:
            os.close(fd)
        return Status.OK

    def _read_range(self, res: Reservation, offset: int, n: int, raddr: int, rkey: int) -> bool:
        """RDMA READ `n` bytes from `raddr` into bytes `[offset, +n)` of a reservation."""
        if n == 0:
            return True
        if res.entry.small is not None:
            b = self.bounce
            if not self._run([(False, b.mr, b.addr, n, raddr, rkey)]):
                return False
            res.views[0][offset : offset + n] = b.view[:n]
            return True
        posts, off = [], 0
        for addr, seg in self._segments(res.entry, offset, n):
            posts.append((False, self.r.arena_mr, addr, seg, raddr + off, rkey))
            off += seg
        return self._run(posts)

    def serve_xfer(
        self, store: Store, is_write: bool, items: list[tuple[bytes, int, int, int, int]]
    ) -> list[tuple[int, int]]:
        """RDMA_XFER: per-item `(status, value length)`; see docs/memkv-protocol.md.

        Reads copy `[value_offset, +len)` of the stored value to the client (NOT_FOUND,
        or SIZE_MISMATCH if the value is shorter). Writes assemble each key's pieces
        into one new value that becomes visible only once every piece has arrived.
        """
        if not is_write:
            out: list[tuple[int, int]] = []
            for key, offset, n, raddr, rkey in items:
                e = store.pin(key)
                if e is None:
                    out.append((Status.NOT_FOUND, 0))
                    continue
                try:
                    if offset + n > e.length:
                        out.append((Status.SIZE_MISMATCH, e.length))
                    else:
                        status = self._write_range(store, e, offset, n, raddr, rkey)
                        out.append((status, 0 if status is Status.NOT_FOUND else e.length))
                finally:
                    store.unpin(e)
            return out
        results: list[tuple[int, int]] = [(Status.SERVER_ERROR, 0)] * len(items)
        for key, (total, idx) in p.xfer_pieces(items).items():
            res = store.reserve(key, total)
            if not isinstance(res, Reservation):
                for i in idx:
                    results[i] = (res, total)
                continue
            ok = True
            try:
                for i in idx:
                    _, offset, n, raddr, rkey = items[i]
                    if not self._read_range(res, offset, n, raddr, rkey):
                        ok = False
                        break
            except BaseException:
                store.abort(res)
                raise
            if ok:
                store.commit(res)
            else:
                store.abort(res)
            for i in idx:
                results[i] = (Status.OK if ok else Status.TRANSFER_FAILED, total)
        return results

    def close(self) -> None:
        self.qp.close()
        if self._bounce is not None:
            self._bounce.close()


def _ok(done: bool) -> Status:
    return Status.OK if done else Status.TRANSFER_FAILED
