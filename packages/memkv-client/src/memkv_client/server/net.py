"""Server networking: one thread per connection, blocking sockets, zero-copy bulk data.

Bulk values are received straight into reserved store blocks (``recvmsg_into``, many
blocks per call) and sent straight from pinned blocks (``sendall``) or spill files
(``sendfile``). A frame that cannot be decoded or authenticated gets an error reply and
the connection is closed; handler exceptions never reach the accept loop, so a bad peer
cannot crash the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import protocol as p
from .._version import __version__
from ..auth import ReplayGuard, Signer
from ..errors import TransportError
from ..protocol import FrameError, Header, Op, Status
from ..sockio import recv_exact, recv_exact_into, recv_views_into, send_views
from .storage import Entry, Store

__all__ = ["MemKVServer"]

log = logging.getLogger("memkv_client.server")
_DRAIN = memoryview(bytearray(1 << 20))
_SINK = memoryview(bytearray(1 << 16))  # shared scratch: contents are never read


class _Closed(Exception):  # noqa: N818 (control flow, not an error)
    """The connection must close after the reply that was just sent."""


class MemKVServer:
    """A MemKV server node; ``start()`` binds, ``serve_forever()`` accepts until stopped."""

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        signer: Signer,
        guard: ReplayGuard | None = None,
        *,
        max_batch_items: int = p.MAX_BATCH_ITEMS,
        rdma: Any = None,
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.signer = signer
        self.guard = guard or ReplayGuard()
        self.max_batch_items = max_batch_items
        self.rdma = rdma  # a server-side RDMA responder (see .rdma), or None
        self.server_id = f"memkv-{os.getpid()}-{int(time.time())}"
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._conns: set[_Connection] = set()
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.counters = {"connections": 0, "requests": 0, "frame_errors": 0, "auth_errors": 0}
        max_value = min(store.max_value, p.DEFAULT_MAX_VALUE_LEN)
        self.info = p.ServerInfo(
            p.VERSION,
            p.MAX_KEY_LEN,
            max_batch_items,
            p.MAX_META_LEN,
            max_value,
            p.DEFAULT_MAX_BULK_LEN,
            rdma is not None,
            self.server_id,
            xfer=rdma is not None,
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(256)
        sock.settimeout(0.2)
        self.port = sock.getsockname()[1]
        self._sock = sock

    def serve_forever(self) -> None:
        """Accept connections until :meth:`request_stop`, then shut down gracefully."""
        assert self._sock is not None, "call start() first"
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                time.sleep(0.01)  # e.g. EMFILE: back off rather than spin
                continue
            c = _Connection(self, conn)
            with self._lock:
                self._conns.add(c)
                self.counters["connections"] += 1
            threading.Thread(target=c.run, name="memkv-conn", daemon=True).start()
        self._shutdown()

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to stop (safe from signal handlers and other threads)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _shutdown(self, grace: float = 10.0) -> None:
        if self._sock is not None:
            self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.stop_if_idle()
        deadline = time.monotonic() + grace
        for c in conns:
            c.done.wait(max(0.0, deadline - time.monotonic()))
            c.close()
        if self.rdma is not None:
            self.rdma.close()
        self.store.close()

    def forget(self, c: _Connection) -> None:
        with self._lock:
            self._conns.discard(c)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            live = len(self._conns)
        return {
            "server_id": self.server_id,
            "version": __version__,
            "protocol": p.VERSION,
            "address": self.address,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "live_connections": live,
            "rdma": self.rdma is not None,
            **{k: v for k, v in self.counters.items()},
            "store": self.store.stats(),
        }


class _Connection:
    def __init__(self, server: MemKVServer, sock: socket.socket) -> None:
        self.server = server
        self.store = server.store
        self.sock = sock
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"
        log.debug("memkv: connection from %s", self.peer)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # reap dead peers
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._busy = False
        self.rdma_peer: Any = None
        self._handlers: dict[Op, Callable[[Header, bytes], None]] = {
            Op.HELLO: self._hello,
            Op.EXISTS: self._exists,
            Op.PUT: self._put,
            Op.GET: self._get,
            Op.DELETE: self._delete,
            Op.SIZE: self._size,
            Op.STATS: self._stats,
            Op.RDMA_CONNECT: self._rdma_connect,
            Op.RDMA_PUT: self._rdma_put,
            Op.RDMA_GET: self._rdma_get,
            Op.RDMA_XFER: self._rdma_xfer,
        }

    def stop_if_idle(self) -> None:
        with self._lock:
            if not self._busy:
                self._shutdown_socket()

    def _shutdown_socket(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._shutdown_socket()
        self.sock.close()

    def run(self) -> None:
        try:
            while not self.server.stopping:
                if not self._serve_one():
                    break
        except _Closed:
            self._drain_and_close()
        except (TransportError, OSError):
            pass
        except Exception:  # a bug must not take the server down
            log.exception("memkv: connection handler failed")
        finally:
            if self.rdma_peer is not None:
                self.rdma_peer.close()
            self.sock.close()
            self.server.forget(self)
            self.done.set()
            log.debug("memkv: connection from %s closed", self.peer)

    def _drain_and_close(self) -> None:
        """After an error reply: half-close, then read what the peer still sends (bounded),
        so the close does not reset the connection and destroy the reply in flight."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(0.5)
            for _ in range(64):
                if not self.sock.recv_into(_SINK):
                    break
        except OSError:
            pass

    def _serve_one(self) -> bool:
        prefix = bytearray(p.PREFIX_SIZE)
        view = memoryview(prefix)
        first = self.sock.recv_into(view)
        if first == 0:
            return False  # clean close between frames
        with self._lock:
            self._busy = True
        try:
            recv_exact_into(self.sock, view[first:])
            self._handle(bytes(prefix))
        finally:
            with self._lock:
                self._busy = False
        return True

    def _handle(self, prefix: bytes) -> None:
        srv = self.server
        try:
            h = p.unpack_header(prefix)
            op = p.check_request_header(h, self.server.info.max_bulk_len)
        except FrameError as exc:
            srv.counters["frame_errors"] += 1
            self._error(None, exc.status, str(exc))
            raise _Closed from None
        meta = bytes(recv_exact(self.sock, h.meta_len))
        if not srv.signer.verify(prefix[: p.HEADER_SIZE], meta, prefix[p.HEADER_SIZE :]):
            srv.counters["auth_errors"] += 1
            self._error(h, Status.BAD_MAC, "request MAC does not verify (wrong auth key)")
            raise _Closed
        verdict = srv.guard.check(h.timestamp_ns, prefix[p.HEADER_SIZE :])
        if verdict is not Status.OK:
            srv.counters["auth_errors"] += 1
            skew = (h.timestamp_ns - time.time_ns()) / 1e9
            msg = "request already seen" if verdict is Status.REPLAY else f"clock skew {skew:+.3f}s"
            self._error(h, verdict, msg)
            raise _Closed
        srv.counters["requests"] += 1
        try:
            self._handlers[op](h, meta)
        except FrameError as exc:
            srv.counters["frame_errors"] += 1
            self._error(h, exc.status, str(exc))
            raise _Closed from None

    # --- replies ------------------------------------------------------------------------

    def _reply(
        self, h: Header, meta: bytes, bulk_len: int = 0, status: Status = Status.OK
    ) -> bytes:
        out = Header(
            p.VERSION, h.op, status, p.FLAG_RESPONSE, h.request_id, time.time_ns(),
            len(meta), bulk_len,
        ).pack()  # fmt: skip
        return out + self.server.signer.sign(out, meta) + meta

    def _error(self, h: Header | None, status: Status, message: str) -> None:
        log.info("memkv: %s: %s: %s; closing", self.peer, status.name, message)
        h = h or Header(p.VERSION, 0, 0, 0, 0, 0, 0, 0)
        with contextlib.suppress(OSError):
            self.sock.sendall(self._reply(h, message.encode(), 0, status))

    # --- operations ---------------------------------------------------------------------

    def _hello(self, h: Header, meta: bytes) -> None:
        lo, hi = p.decode_hello(meta)
        version = min(hi, p.MAX_VERSION)
        if version < max(lo, p.MIN_VERSION):
            self._error(
                h,
                Status.UNSUPPORTED_VERSION,
                f"client speaks {lo}..{hi}, server {p.MIN_VERSION}..{p.MAX_VERSION}",
            )
            raise _Closed
        info = self.server.info
        reply = p.ServerInfo(
            version, info.max_key_len, info.max_batch_items, info.max_meta_len,
            info.max_value_len, info.max_bulk_len, info.rdma, info.server_id, info.xfer,
        )  # fmt: skip
        self.sock.sendall(self._reply(h, p.encode_hello_reply(reply)))

    def _exists(self, h: Header, meta: bytes) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        flags = [int(f) for f in self.store.exists(keys)]
        self.sock.sendall(self._reply(h, p.encode_flags(flags)))

    def _delete(self, h: Header, meta: bytes) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        codes = [Status.OK if self.store.delete(k) else Status.NOT_FOUND for k in keys]
        self.sock.sendall(self._reply(h, p.encode_flags(codes)))

    def _size(self, h: Header, meta: bytes) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        out = []
        for k in keys:
            n = self.store.size(k)
            out.append((Status.NOT_FOUND, 0) if n is None else (Status.OK, n))
        self.sock.sendall(self._reply(h, p.encode_status_lengths(out)))

    def _stats(self, h: Header, meta: bytes) -> None:
        self.sock.sendall(self._reply(h, json.dumps(self.server.stats()).encode()))

    def _drain(self, n: int) -> None:
        while n:
            k = min(n, len(_DRAIN))
            recv_exact_into(self.sock, _DRAIN[:k])
            n -= k

    def _put(self, h: Header, meta: bytes) -> None:
        items = p.decode_key_lengths(meta, self.server.max_batch_items)
        if sum(n for _, n in items) != h.bulk_len:
            raise FrameError(Status.INVALID_REQUEST, "bulk_len does not match item lengths")
        codes: list[int] = []
        for key, n in items:
            res = self.store.reserve(key, n)
            if isinstance(res, Status):
                self._drain(n)
                codes.append(res)
                continue
            try:
                recv_views_into(self.sock, res.views, batch_wakeups=True)
            except BaseException:
                self.store.abort(res)
                raise
            self.store.commit(res)
            codes.append(Status.OK)
        self.sock.sendall(self._reply(h, p.encode_flags(codes)))

    def _pin_for_read(
        self, items: list[tuple[bytes, int]]
    ) -> tuple[list[Entry], list[tuple[int, int]]]:
        pinned: list[Entry] = []
        out: list[tuple[int, int]] = []
        for key, n in items:
            e = self.store.pin(key)
            if e is None:
                out.append((Status.NOT_FOUND, 0))
            elif e.length != n:
                self.store.unpin(e)
                out.append((Status.SIZE_MISMATCH, e.length))
            else:
                pinned.append(e)
                out.append((Status.OK, n))
        return pinned, out

    def _get(self, h: Header, meta: bytes) -> None:
        items = p.decode_key_lengths(meta, self.server.max_batch_items)
        pinned, out = self._pin_for_read(items)
        try:
            bulk = sum(e.length for e in pinned)
            head = self._reply(h, p.encode_status_lengths(out), bulk)
            self.sock.sendall(head)
            for e in pinned:
                if e.path is not None:
                    self._send_file(e)
                else:
                    send_views(self.sock, b"", self.store.views(e))
        finally:
            for e in pinned:
                self.store.unpin(e)

    def _send_file(self, e: Entry) -> None:
        fd = self.store.open_spilled(e)
        with os.fdopen(fd, "rb") as f:
            sent = self.sock.sendfile(f, 0, e.length)
        if sent != e.length:
            raise TransportError("spill file shorter than its value")

    # --- RDMA control (bulk moves by one-sided verbs; see .rdma) ---------

    def _require_rdma(self) -> Any:
        if self.server.rdma is None:
            raise FrameError(Status.UNSUPPORTED, "this server has no RDMA device")
        return self.server.rdma

    def _rdma_connect(self, h: Header, meta: bytes) -> None:
        responder = self._require_rdma()
        if self.rdma_peer is not None:
            self.rdma_peer.close()
        self.rdma_peer, reply = responder.accept(meta)
        self.sock.sendall(self._reply(h, reply))

    def _rdma_put(self, h: Header, meta: bytes) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_PUT before RDMA_CONNECT")
        items = p.decode_remote_items(meta, self.server.max_batch_items)
        codes = self.rdma_peer.serve_put(self.store, items)
        self.sock.sendall(self._reply(h, p.encode_flags(codes)))

    def _rdma_get(self, h: Header, meta: bytes) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_GET before RDMA_CONNECT")
        items = p.decode_remote_items(meta, self.server.max_batch_items)
        out = self.rdma_peer.serve_get(self.store, items)
        self.sock.sendall(self._reply(h, p.encode_status_lengths(out)))

    def _rdma_xfer(self, h: Header, meta: bytes) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_XFER before RDMA_CONNECT")
        is_write, items = p.decode_xfer(meta, self.server.max_batch_items)
        out = self.rdma_peer.serve_xfer(self.store, is_write, items)
        self.sock.sendall(self._reply(h, p.encode_status_lengths(out)))
