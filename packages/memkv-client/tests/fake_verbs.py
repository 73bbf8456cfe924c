"""A fake verbs backend for tests: the only stand-in for the RDMA hardware.

It implements `memkv_client.verbs.VerbsBackend` / `QueuePair` for one process:
a `Fabric` holds every registered region by rkey and every queue pair by number;
one-sided READ/WRITE are `memmove` between registered ranges, with the same checks a
NIC makes (local range inside the lkey's region, remote range inside the rkey's region,
queue pair connected). Errors complete the work request with a failed status, like a
NIC, instead of raising. `Fabric.fail_next` injects failed completions.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import threading
from collections import deque

from memkv_client.verbs import Completion, MemoryRegion, QueuePair, VerbsBackend


class Fabric:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.regions: dict[int, MemoryRegion] = {}  # rkey -> region
        self.qps: dict[int, FakeQP] = {}
        self._keys = itertools.count(0x1000)
        self._qpns = itertools.count(1)
        self.fail_budget = 0
        self.ops = {"read": 0, "write": 0}

    def fail_next(self, n: int) -> None:
        with self.lock:
            self.fail_budget = n

    def backend(self, name: str = "fake0") -> FakeBackend:
        return FakeBackend(self, name)


class FakeBackend(VerbsBackend):
    def __init__(self, fabric: Fabric, name: str) -> None:
        self.fabric = fabric
        self.name = name
        self.closed = False

    def register(self, addr: int, length: int) -> MemoryRegion:
        assert addr > 0
        assert length > 0
        with self.fabric.lock:
            key = next(self.fabric._keys)
            mr = MemoryRegion(addr, length, key, key, self)
            self.fabric.regions[key] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        with self.fabric.lock:
            del self.fabric.regions[mr.rkey]

    def create_qp(self) -> QueuePair:
        return FakeQP(self.fabric)

    def close(self) -> None:
        self.closed = True


class FakeQP(QueuePair):
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        with fabric.lock:
            self.qpn = next(fabric._qpns)
            fabric.qps[self.qpn] = self
        self.peer: FakeQP | None = None
        self.cq: deque[Completion] = deque()

    def endpoint(self) -> bytes:
        return json.dumps({"qpn": self.qpn}).encode()

    def connect(self, remote: bytes) -> None:
        qpn = json.loads(remote)["qpn"]
        with self.fabric.lock:
            peer = self.fabric.qps.get(qpn)
        if peer is None:
            raise RuntimeError(f"no such queue pair {qpn}")
        self.peer = peer

    def _op(
        self, kind: str, wr_id: int, mr: MemoryRegion, addr: int, n: int, raddr: int, rkey: int
    ) -> None:
        f = self.fabric
        with f.lock:
            error = ""
            remote = f.regions.get(rkey)
            if self.peer is None or self.peer.qpn not in f.qps:
                error = "queue pair not connected"
            elif f.regions.get(mr.lkey) is not mr or not mr.contains(addr, n):
                error = "local protection error"
            elif remote is None or not remote.contains(raddr, n):
                error = "remote access error"
            elif f.fail_budget > 0:
                f.fail_budget -= 1
                error = "injected failure"
            if not error:
                src, dst = (addr, raddr) if kind == "write" else (raddr, addr)
                ctypes.memmove(dst, src, n)
                f.ops[kind] += 1
            self.cq.append(Completion(wr_id, not error, error))

    def post_write(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        self._op("write", wr_id, mr, addr, length, raddr, rkey)

    def post_read(
        self, wr_id: int, mr: MemoryRegion, addr: int, length: int, raddr: int, rkey: int
    ) -> None:
        self._op("read", wr_id, mr, addr, length, raddr, rkey)

    def poll(self, max_entries: int) -> list[Completion]:
        out = []
        while self.cq and len(out) < max_entries:
            out.append(self.cq.popleft())
        return out

    def close(self) -> None:
        with self.fabric.lock:
            self.fabric.qps.pop(self.qpn, None)
