"""The verbs backend interface, and its implementation over Debian's `python3-pyverbs`.

The RDMA engine (`.rdma`) only ever talks to `VerbsBackend` and
`QueuePair`: register memory, create an RC queue pair, exchange endpoints,
post one-sided READ/WRITE, poll completions. pyverbs is imported lazily, inside
`open_verbs_backend`, so this package imports on any Linux host.
"""

from __future__ import annotations

import abc
import ctypes
import json
import mmap
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Completion",
    "MemoryRegion",
    "PinnedBuffer",
    "PyverbsBackend",
    "QueuePair",
    "VerbsBackend",
    "open_verbs_backend",
]

_DEBIAN_DIST = "/usr/lib/python3/dist-packages"


@dataclass(frozen=True)
class MemoryRegion:
    """Registered memory: `[addr, addr + length)` with its local and remote keys."""

    addr: int
    length: int
    lkey: int
    rkey: int
    handle: Any = None

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.addr + self.length


@dataclass(frozen=True)
class Completion:
    wr_id: int
    ok: bool
    error: str = ""


class QueuePair(abc.ABC):
    """One reliable-connected queue pair with its own completion queue."""

    @abc.abstractmethod
    def endpoint(self) -> bytes:
        """This side's connection data, sent to the peer over the TCP control session."""

    @abc.abstractmethod
    def connect(self, remote: bytes) -> None:
        """Move to ready-to-send against the peer's `endpoint` data."""

    @abc.abstractmethod
    def post_write(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        """One-sided RDMA WRITE of local `[addr, +length)` to remote `raddr`."""

    @abc.abstractmethod
    def post_read(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        """One-sided RDMA READ of remote `raddr` into local `[addr, +length)`."""

    @abc.abstractmethod
    def poll(self, max_entries: int) -> list[Completion]:
        """Completions available now (does not wait)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def wait(self, wr_ids: Sequence[int], timeout: float) -> list[Completion]:
        """Poll until every id in `wr_ids` completed or `timeout` passed."""
        pending = set(wr_ids)
        done: list[Completion] = []
        deadline = time.monotonic() + timeout
        spins = 0
        while pending:
            for c in self.poll(64):
                if c.wr_id in pending:
                    pending.discard(c.wr_id)
                    done.append(c)
            if not pending:
                break
            if time.monotonic() > deadline:
                done += [Completion(w, False, "completion timed out") for w in pending]
                break
            spins += 1
            if spins > 64:
                time.sleep(0.00005)
        return done


class VerbsBackend(abc.ABC):
    """A device context: memory registration and queue-pair creation."""

    name: str = "verbs"

    @abc.abstractmethod
    def register(self, addr: int, length: int) -> MemoryRegion:
        """Register `[addr, +length)` for local and remote read/write."""

    @abc.abstractmethod
    def deregister(self, mr: MemoryRegion) -> None: ...

    @abc.abstractmethod
    def create_qp(self) -> QueuePair: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Release the device context."""


class PinnedBuffer:
    """An anonymous mapping registered with the backend (staging or bounce memory)."""

    def __init__(self, backend: VerbsBackend, size: int) -> None:
        self._map = mmap.mmap(-1, size)
        self.view = memoryview(self._map)
        anchor = ctypes.c_char.from_buffer(self._map)
        self.addr = ctypes.addressof(anchor)
        del anchor
        self.mr = backend.register(self.addr, size)
        self._backend = backend

    def close(self) -> None:
        self._backend.deregister(self.mr)
        self.view.release()
        self._map.close()


# --- pyverbs ------------------------------------------------------------------------


def _import_pyverbs() -> Any:
    try:
        import pyverbs.device
    except ImportError:
        # Debian's python3-pyverbs lives in the system dist-packages (CPython 3.11 ABI).
        if sys.version_info[:2] != (3, 11) or not os.path.isdir(f"{_DEBIAN_DIST}/pyverbs"):
            raise
        # Only for this import: pyverbs' submodules resolve through the package's own
        # __path__ afterwards, so the system dist-packages need not stay on sys.path.
        sys.path.append(_DEBIAN_DIST)
        try:
            import pyverbs.device
        finally:
            sys.path.remove(_DEBIAN_DIST)
    return pyverbs


def _enum(name: str) -> int:
    """A verbs constant by name: pyverbs 44 (`pyverbs.enums`) or 59 (IntEnum classes)."""
    try:
        import pyverbs.enums as flat

        return int(getattr(flat, name))
    except ImportError:
        import pyverbs.libibverbs_enums as classes

        for obj in vars(classes).values():
            if hasattr(obj, name):
                return int(getattr(obj, name))
        raise AttributeError(name) from None


def open_verbs_backend(
    devices: Sequence[str], options: dict[str, int] | None = None
) -> tuple[VerbsBackend | None, str]:
    """The first usable device among `devices` (all if empty), or `(None, reason)`.

    `get_device_list()` raising (no RDMA stack in the kernel) counts as no device,
    exactly like an empty list.
    """
    try:
        pv = _import_pyverbs()
    except ImportError:
        return None, "pyverbs is not installed (apt-get install python3-pyverbs)"
    try:
        found = [d.name.decode() for d in pv.device.get_device_list()]
    except Exception as exc:  # PyverbsRDMAError on kernels without RDMA support
        return None, f"no RDMA devices ({exc})"
    if not found:
        return None, "no RDMA devices"
    usable = [n for n in found if not devices or n in devices]
    if not usable:
        return None, f"none of {', '.join(devices)} present (found {', '.join(found)})"
    try:
        return PyverbsBackend(usable[0], **(options or {})), ""
    except Exception as exc:
        return None, f"cannot open {usable[0]}: {exc}"


class PyverbsBackend(VerbsBackend):
    """Verbs over pyverbs: one context, PD and port; RC queue pairs. Thread-safe."""

    def __init__(
        self,
        device: str,
        port: int = 1,
        gid_index: int = 0,
        traffic_class: int = 0,
        service_level: int = 0,
        mtu: int = 4096,
        pkey_index: int = 0,
    ) -> None:
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.name = device
        self.ctx = Context(name=device)
        self.pd = PD(self.ctx)
        self.port = port
        self.gid_index = gid_index
        self.traffic_class = traffic_class
        self.service_level = service_level
        self.pkey_index = pkey_index
        self.mtu = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}[mtu]
        self.lid = self.ctx.query_port(port).lid
        self.gid = str(self.ctx.query_gid(port, gid_index))
        self._lock = threading.Lock()

    def register(self, addr: int, length: int) -> MemoryRegion:
        from pyverbs.mr import MR

        access = (
            _enum("IBV_ACCESS_LOCAL_WRITE")
            | _enum("IBV_ACCESS_REMOTE_WRITE")
            | _enum("IBV_ACCESS_REMOTE_READ")
        )
        with self._lock:
            mr = MR(self.pd, length, access, address=addr)
        return MemoryRegion(addr, length, mr.lkey, mr.rkey, mr)

    def deregister(self, mr: MemoryRegion) -> None:
        with self._lock:
            mr.handle.close()

    def create_qp(self) -> QueuePair:
        return _PyverbsQP(self)

    def close(self) -> None:
        self.pd.close()
        self.ctx.close()


def connect_attrs(
    peer: dict[str, Any],
    psn: int,
    port: int,
    gid_index: int,
    traffic_class: int,
    service_level: int,
    mtu_enum: int,
) -> Any:
    """The `QPAttr` for INIT->RTR->RTS of an RC queue pair towards `peer`.

    `peer` is the decoded endpoint `{"qpn", "psn", "lid", "gid"}`. Needs pyverbs but
    no device, so it is tested wherever pyverbs imports.
    """
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.qp import QPAttr

    route = GlobalRoute(
        dgid=GID(str(peer["gid"])),
        sgid_index=gid_index,
        hop_limit=64,
        traffic_class=traffic_class,
    )
    attr = QPAttr()
    attr.port_num = port
    attr.path_mtu = mtu_enum
    attr.dest_qp_num = int(peer["qpn"])
    attr.rq_psn = int(peer["psn"])
    attr.max_dest_rd_atomic = 16
    attr.min_rnr_timer = 12
    attr.ah_attr = AHAttr(
        is_global=1, port_num=port, dlid=int(peer["lid"]), sl=service_level, gr=route
    )
    attr.sq_psn = psn
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    attr.max_rd_atomic = 16
    return attr


class _PyverbsQP(QueuePair):
    DEPTH = 512

    def __init__(self, be: PyverbsBackend) -> None:
        from pyverbs.cq import CQ
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.be = be
        self.cq = CQ(be.ctx, self.DEPTH * 2)
        cap = QPCap(max_send_wr=self.DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=_enum("IBV_QPT_RC"), scq=self.cq, rcq=self.cq, cap=cap)
        attr = QPAttr()
        attr.port_num = be.port
        attr.qp_access_flags = _enum("IBV_ACCESS_REMOTE_WRITE") | _enum("IBV_ACCESS_REMOTE_READ")
        attr.pkey_index = be.pkey_index
        self.qp = QP(be.pd, init, attr)  # returned in INIT
        self.psn = random.getrandbits(24)

    def endpoint(self) -> bytes:
        info = {"qpn": self.qp.qp_num, "psn": self.psn, "lid": self.be.lid, "gid": self.be.gid}
        return json.dumps(info).encode()

    def connect(self, remote: bytes) -> None:
        be = self.be
        attr = connect_attrs(
            json.loads(remote), self.psn, be.port, be.gid_index, be.traffic_class,
            be.service_level, be.mtu,
        )  # fmt: skip
        self.qp.to_rtr(attr)
        self.qp.to_rts(attr)

    def _post(
        self, opcode: str, wr_id: int, mr: MemoryRegion, addr: int, n: int, raddr: int, rkey: int
    ) -> None:
        from pyverbs.wr import SGE, SendWR

        wr = SendWR(
            wr_id=wr_id,
            opcode=_enum(opcode),
            num_sge=1,
            sg=[SGE(addr, n, mr.lkey)],
            send_flags=_enum("IBV_SEND_SIGNALED"),
        )
        wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)

    def post_write(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        self._post("IBV_WR_RDMA_WRITE", wr_id, mr, addr, length, raddr, rkey)

    def post_read(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        self._post("IBV_WR_RDMA_READ", wr_id, mr, addr, length, raddr, rkey)

    def poll(self, max_entries: int) -> list[Completion]:
        n, wcs = self.cq.poll(max_entries)
        ok = _enum("IBV_WC_SUCCESS")
        return [Completion(wc.wr_id, wc.status == ok, f"wc status {wc.status}") for wc in wcs[:n]]

    def close(self) -> None:
        self.qp.close()
        self.cq.close()
