"""RDMA data path: RC queue pairs bootstrapped over the TCP session, one-sided bulk moves.

Client side: `RdmaEngine` owns registered regions and a registered staging pool;
`RdmaEngine.upgrade` turns a HELLO'd TCP session into an `RdmaSession` by
exchanging queue-pair endpoints (`RDMA_CONNECT`). Control messages stay on TCP;
`RDMA_PUT`/`RDMA_GET` carry `(key, length, address, rkey)` and the *server* moves
the bytes with one-sided READ (put) or WRITE (get) against the client's memory, then
replies with per-item statuses. Memory inside a region given to `register_region` is
used in place; other buffers go through a staging slot (one copy); values that fit no
slot go over TCP.

The server side (`RdmaResponder`/`RdmaPeer`) lives in `.server.rdma`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from . import protocol as p
from .config import Config, Transport
from .errors import LocalProtocolError, MemKVError, RdmaUnavailableError, TransportError
from .protocol import Op, Status
from .session import TcpSession
from .verbs import MemoryRegion, PinnedBuffer, QueuePair, VerbsBackend, open_verbs_backend

__all__ = ["RdmaEngine", "RdmaSession", "open_verbs_backend_for"]

log = logging.getLogger("memkv_client")


def open_verbs_backend_for(config: Config) -> tuple[VerbsBackend | None, str]:
    """`memkv_client.verbs.open_verbs_backend` with the client's RDMA settings."""
    return open_verbs_backend(
        config.rdma_devices,
        {
            "gid_index": config.gid_index,
            "traffic_class": config.traffic_class,
            "service_level": config.service_level,
            "mtu": config.mtu,
            "pkey_index": config.pkey_index,
        },
    )


def view_address(view: memoryview) -> int | None:
    """Address of a writable buffer's first byte (None for read-only or empty buffers)."""
    if view.readonly or len(view) == 0:
        return None
    anchor = ctypes.c_char.from_buffer(view)
    addr = ctypes.addressof(anchor)
    del anchor
    return addr


class RdmaEngine:
    """Client-side RDMA state shared by all sessions of one `Client`. Thread-safe."""

    def __init__(self, backend: VerbsBackend, config: Config) -> None:
        self.backend = backend
        self.config = config
        self.timeout = float(config.rdma_timeout_secs)
        self._regions: dict[int, MemoryRegion] = {}
        self._lock = threading.Lock()
        self.slot_size = config.staging_slot_mb << 20
        nslots = max(1, config.staging_size_mb // config.staging_slot_mb)
        self._staging = PinnedBuffer(backend, nslots * self.slot_size)
        self._free_slots = list(range(nslots))
        self._warned: set[str] = set()

    # regions
    def register_region(self, addr: int, length: int) -> None:
        mr = self.backend.register(addr, length)
        with self._lock:
            old = self._regions.pop(addr, None)
            self._regions[addr] = mr
        if old is not None:
            self.backend.deregister(old)

    def deregister_region(self, addr: int) -> None:
        with self._lock:
            mr = self._regions.pop(addr, None)
        if mr is not None:
            self.backend.deregister(mr)

    def find(self, addr: int, length: int) -> MemoryRegion | None:
        with self._lock:
            for mr in self._regions.values():
                if mr.contains(addr, length):
                    return mr
        return None

    # staging
    def take_slot(self, n: int) -> int | None:
        if n > self.slot_size:
            return None
        with self._lock:
            return self._free_slots.pop() if self._free_slots else None

    def give_slot(self, slot: int) -> None:
        with self._lock:
            self._free_slots.append(slot)

    def view_at(self, addr: int, n: int) -> memoryview:
        """The staging bytes at `[addr, +n)`."""
        start = addr - self._staging.addr
        return self._staging.view[start : start + n]

    def slot_addr(self, slot: int) -> int:
        return self._staging.addr + slot * self.slot_size

    @property
    def staging_mr(self) -> MemoryRegion:
        return self._staging.mr

    def upgrade(self, session: TcpSession) -> TcpSession | RdmaSession:
        """Bootstrap a queue pair over `session`; keep TCP if the server has no RDMA."""
        if not session.info.rdma:
            if self.config.transport is not Transport.AUTO:
                session.close()
                raise RdmaUnavailableError(f"{session.address}: server has no RDMA device")
            if session.address not in self._warned:
                self._warned.add(session.address)
                log.info("memkv: %s has no RDMA; using TCP for it", session.address)
            return session
        try:
            qp = self.backend.create_qp()
        except Exception as exc:
            session.close()
            raise TransportError(f"{session.address}: cannot create a queue pair: {exc}") from None
        try:
            _, reply = session.call(Op.RDMA_CONNECT, qp.endpoint())
            qp.connect(reply)
        except MemKVError:
            qp.close()
            session.close()
            raise
        except Exception as exc:  # verbs errors (PyverbsRDMAError, ...)
            qp.close()
            session.close()
            raise TransportError(f"{session.address}: RDMA connect failed: {exc}") from None
        return RdmaSession(session, qp, self)

    def close(self) -> None:
        with self._lock:
            regions, self._regions = list(self._regions.values()), {}
        for mr in regions:
            self.backend.deregister(mr)
        self._staging.close()
        self.backend.close()


class RdmaSession:
    """A TCP control session plus a connected queue pair; bulk data moves one-sided."""

    rdma = True  #: one-sided RDMA data path (`batch_xfer` needs it)

    def __init__(self, tcp: TcpSession, qp: QueuePair, engine: RdmaEngine) -> None:
        self.tcp = tcp
        self.qp = qp
        self.engine = engine
        self.info = tcp.info
        self.address = tcp.address

    @property
    def broken(self) -> bool:
        return self.tcp.broken

    @broken.setter
    def broken(self, value: bool) -> None:
        self.tcp.broken = value

    @property
    def deadline(self) -> float | None:
        return self.tcp.deadline

    @deadline.setter
    def deadline(self, value: float | None) -> None:
        self.tcp.deadline = value

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        return self.tcp.exists(keys)

    def delete(self, keys: Sequence[bytes]) -> list[int]:
        return self.tcp.delete(keys)

    def size(self, keys: Sequence[bytes]) -> list[tuple[int, int]]:
        return self.tcp.size(keys)

    def stats(self) -> dict[str, Any]:
        return self.tcp.stats()

    def _plan(
        self, items: Sequence[tuple[bytes, memoryview]], copy_in: bool
    ) -> tuple[list[tuple[int, tuple[bytes, int, int, int]]], dict[int, int], list[int], list[int]]:
        """Split items into remote (one-sided) ones and TCP ones.

        Unregistered buffers are packed into staging slots (several small items per
        slot). Returns (remote items, staging address per staged item, slots taken,
        TCP item indices).
        """
        remote: list[tuple[int, tuple[bytes, int, int, int]]] = []
        staged: dict[int, int] = {}
        slots: list[int] = []
        tcp: list[int] = []
        eng = self.engine
        room = 0  # free bytes left in the newest slot
        for i, (key, view) in enumerate(items):
            n = len(view)
            addr = view_address(view)
            mr = eng.find(addr, n) if addr is not None else None
            if mr is not None:
                assert addr is not None
                remote.append((i, (key, n, addr, mr.rkey)))
                continue
            if n == 0 or n > eng.slot_size:
                tcp.append(i)
                continue
            if n > room:
                slot = eng.take_slot(n)
                if slot is None:
                    tcp.append(i)
                    continue
                slots.append(slot)
                room = eng.slot_size
            addr = eng.slot_addr(slots[-1]) + (eng.slot_size - room)
            room -= n
            staged[i] = addr
            if copy_in:
                eng.view_at(addr, n)[:] = view
            remote.append((i, (key, n, addr, eng.staging_mr.rkey)))
        return remote, staged, slots, tcp

    def put(self, items: Sequence[tuple[bytes, memoryview]]) -> list[int]:
        codes = [int(Status.VALUE_TOO_LARGE)] * len(items)
        fits = [i for i, (_, v) in enumerate(items) if len(v) <= self.info.max_value_len]
        sub = [items[i] for i in fits]
        remote, _, slots, tcp = self._plan(sub, copy_in=True)
        try:
            if remote:
                meta = p.encode_remote_items([r for _, r in remote])
                _, reply = self.tcp.call(Op.RDMA_PUT, meta)
                flags = self.tcp._decode(p.decode_flags, reply, len(remote))
                for (j, _), code in zip(remote, flags, strict=True):
                    codes[fits[j]] = code
            if tcp:
                for j, code in zip(tcp, self.tcp.put([sub[j] for j in tcp]), strict=True):
                    codes[fits[j]] = code
        finally:
            for slot in slots:
                self.engine.give_slot(slot)
        return codes

    def get_into(self, items: Sequence[tuple[bytes, memoryview]]) -> list[tuple[int, int]]:
        out = [(int(Status.NOT_FOUND), 0)] * len(items)
        remote, staged, slots, tcp = self._plan(items, copy_in=False)
        try:
            if remote:
                meta = p.encode_remote_items([r for _, r in remote])
                _, reply = self.tcp.call(Op.RDMA_GET, meta)
                pairs = self.tcp._decode(p.decode_status_lengths, reply, len(remote))
                for (i, (_, n, _, _)), (status, length) in zip(remote, pairs, strict=True):
                    out[i] = (status, length)
                    if status == Status.OK and i in staged:
                        items[i][1][:] = self.engine.view_at(staged[i], n)
            if tcp:
                for i, pair in zip(tcp, self.tcp.get_into([items[i] for i in tcp]), strict=True):
                    out[i] = pair
        finally:
            for slot in slots:
                self.engine.give_slot(slot)
        return out

    def xfer(
        self, items: Sequence[tuple[bytes, int, int, int]], is_write: bool
    ) -> list[tuple[int, int]]:
        """RDMA_XFER of `(key, addr, length, value_offset)` items in registered memory.

        Per-item `(status, value length)`. A server that does not advertise RDMA_XFER
        gets nothing sent: every item is UNSUPPORTED.
        """
        if not self.info.xfer:
            return [(int(Status.UNSUPPORTED), 0)] * len(items)
        wire = []
        for key, addr, n, offset in items:
            mr = self.engine.find(addr, n)
            if mr is None:  # the Client checks first; a region deregistered meanwhile
                raise LocalProtocolError(f"[{addr:#x}, +{n}) is not in a registered region")
            wire.append((key, offset, n, addr, mr.rkey))
        _, reply = self.tcp.call(Op.RDMA_XFER, p.encode_xfer(is_write, wire))
        pairs: list[tuple[int, int]] = self.tcp._decode(p.decode_status_lengths, reply, len(items))
        return pairs

    def close(self) -> None:
        self.qp.close()
        self.tcp.close()
