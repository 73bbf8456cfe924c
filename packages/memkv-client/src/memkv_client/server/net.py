"""Server networking: one thread per connection, blocking sockets, zero-copy bulk data.

Bulk values are received straight into reserved store blocks (`recvmsg_into`, many
blocks per call) and sent straight from pinned blocks (`sendall`) or spill files
(`sendfile`). A frame that cannot be decoded or authenticated gets an error reply and
the connection is closed; handler exceptions never reach the accept loop, so a bad peer
cannot crash the server.

**Hostile peers.** A connection is authenticated only by an AUTH that answers the
fresh challenge its HELLO reply carried, so replayed opening bytes never authenticate.
At most `max_connections` connections are served; when full, one is closed to make
room: the oldest that has sent nothing yet, else the unauthenticated one that has waited
longest since it last spoke (a HELLO held open without its AUTH), else the authenticated
one idle longest (a client retries a pooled connection closed under it); else the new one
is refused. So a valid client between HELLO and AUTH, one round trip old, is never closed
while connections that have sent nothing, or have waited longer, are open.
Until it authenticates, a connection may send only HELLO and AUTH of at most
`PREAUTH_MAX_META_LEN` metadata bytes, each within `frame_timeout`. Every frame must
arrive, and every reply leave, within `frame_timeout` plus its size at `MIN_RATE`; a
connection idle for `idle_timeout` is closed. A deadline miss closes the connection
and releases everything it held (reservations, pins).
"""

from __future__ import annotations

import _thread
import contextlib
import json
import logging
import os
import resource
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import protocol as p
from .._version import __version__
from ..auth import ClockWindow, Signer, value_digest
from ..errors import TransportError
from ..protocol import FrameError, Header, Op, Status
from ..sockio import arm, recv_exact_into, recv_views_into, send_views
from .storage import Entry, Store

__all__ = ["MIN_RATE", "MemKVServer", "default_max_connections"]

log = logging.getLogger("memkv_client.server")
_DRAIN = memoryview(bytearray(1 << 20))
_SINK = memoryview(bytearray(1 << 16))  # shared scratch: contents are never read
_META_CHUNK = 64 << 10  # metadata is read and MAC-fed in pieces of this size
MIN_RATE = 8 << 20  #: bytes/s a peer must sustain on a frame beyond `frame_timeout`
_FD_RESERVE = 64  # descriptors kept free for spill files, the listener and logging
_GONE = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL  # peer left


def default_max_connections() -> int:
    """The connection cap that keeps `_FD_RESERVE` descriptors free under `ulimit -n`."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, min(4096, soft - _FD_RESERVE))


class _Closed(Exception):  # noqa: N818 (control flow, not an error)
    """The connection must close after the reply that was just sent."""


class MemKVServer:
    """A MemKV server node; `start()` binds, `serve_forever()` accepts until stopped."""

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        signer: Signer,
        clock: ClockWindow | None = None,
        *,
        max_batch_items: int = p.MAX_BATCH_ITEMS,
        rdma: Any = None,
        max_connections: int | None = None,
        frame_timeout: float = 10.0,
        idle_timeout: float = 300.0,
    ) -> None:
        self.store = store
        self.host = host
        self.port = port
        self.signer = signer
        self.clock = clock or ClockWindow()
        self.max_batch_items = max_batch_items
        self.rdma = rdma  # a server-side RDMA responder (see .rdma), or None
        self.max_connections = max_connections or default_max_connections()
        self.frame_timeout = frame_timeout
        self.idle_timeout = idle_timeout
        self.boot_nonce = secrets.token_bytes(p.NONCE_SIZE)
        self.server_id = f"memkv-{os.getpid()}-{int(time.time())}"
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self._conns: dict[_Connection, None] = {}  # in accept order
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self.counters = {
            "connections": 0,
            "requests": 0,
            "frame_errors": 0,
            "auth_errors": 0,
            "refused_connections": 0,  # over max_connections, nothing to make room
            "unauthenticated_closed": 0,  # not authenticated; closed to make room for a new one
            "idle_closed": 0,  # authenticated but idle, closed to make room
            "deadline_closes": 0,  # a frame or reply missed its deadline, or idle
        }
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
            boot_nonce=self.boot_nonce,
            idle_timeout_ms=int(idle_timeout * 1000),
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
        """Accept connections until `request_stop`, then shut down gracefully."""
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
            if not self._make_room():
                self.counters["refused_connections"] += 1
                log.warning(
                    "memkv: refusing a connection: %d connections (--max-connections)",
                    self.max_connections,
                )
                conn.close()
                continue
            c = _Connection(self, conn)
            with self._lock:
                self._conns[c] = None
                self.counters["connections"] += 1
            # Not `threading.Thread.start`: it waits until the new thread runs, which under
            # a connection flood holds the accept loop (and the clients queued behind the
            # flood) behind the GIL.
            _thread.start_new_thread(c.run, ())
        self._shutdown()

    def _make_room(self) -> bool:
        """Whether one more connection fits, closing one to make room if needed (the
        order is in the module docstring)."""
        with self._lock:
            if len(self._conns) < self.max_connections:
                return True
            victim = next((c for c in self._conns if c.silent()), None)
            if victim is None:
                waiting = [c for c in self._conns if not c.authenticated]
                victim = min(waiting, key=lambda c: c.last_active, default=None)
            if victim is not None:
                del self._conns[victim]  # its thread ends on the shut-down socket
                self.counters["unauthenticated_closed"] += 1
                victim.shutdown_socket()
                return True
            for c in sorted(self._conns, key=lambda c: c.last_active):
                if c.stop_if_idle():
                    del self._conns[c]
                    self.counters["idle_closed"] += 1
                    return True
            return False

    def request_stop(self) -> None:
        """Ask `serve_forever` to stop (safe from signal handlers and other threads)."""
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
            self._conns.pop(c, None)

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
            "max_connections": self.max_connections,
            "frame_timeout_s": self.frame_timeout,
            "idle_timeout_s": self.idle_timeout,
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
        self.last_active = time.monotonic()  # when the last frame began or was done
        self.spoke = False  # a frame's first bytes arrived
        self.challenge: bytes | None = None  # sent in the HELLO reply; AUTH answers it
        self.authenticated = False  # the AUTH verified
        self.session = server.signer  # the session key once HELLO is answered
        self._reply_signer = server.signer
        self._last_id = 0
        self.rdma_peer: Any = None
        self._handlers: dict[Op, Callable[[Header, bytes, float], None]] = {
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
            Op.AUTH: self._auth,
        }

    def silent(self) -> bool:
        """Whether the peer has sent nothing yet: no frame served and no byte waiting."""
        if self.spoke:
            return False
        # poll, never recv: the socket's timeout would make even a MSG_PEEK recv wait
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN | select.POLLRDHUP)
            events = poller.poll(0)
        except (OSError, ValueError):
            return True  # closed by its own thread: nothing to keep
        if not events:
            return True  # connected, nothing sent
        return bool(events[0][1] & _GONE)  # else bytes wait to be read

    def stop_if_idle(self) -> bool:
        """Shut the socket down unless a frame is being served; whether it was."""
        with self._lock:
            if self._busy:
                return False
            self.shutdown_socket()
            return True

    def shutdown_socket(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shutdown_socket()
        self.sock.close()

    def _deadline(self, nbytes: int = 0) -> float:
        """When a frame (or reply) of `nbytes` bulk+meta bytes must be done."""
        return time.monotonic() + self.server.frame_timeout + nbytes / MIN_RATE

    def run(self) -> None:
        try:
            while not self.server.stopping:
                if not self._serve_one():
                    break
        except _Closed:
            self._drain_and_close()
        except TimeoutError:
            self.server.counters["deadline_closes"] += 1
            log.info("memkv: %s: deadline passed; closing", self.peer)
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
        srv = self.server
        wait = srv.idle_timeout if self.authenticated else srv.frame_timeout
        arm(self.sock, time.monotonic() + wait)
        first = self.sock.recv_into(view)
        if first == 0:
            return False  # clean close between frames
        self.spoke = True
        with self._lock:
            self._busy = True
            self.last_active = time.monotonic()
        try:
            deadline = self._deadline()
            recv_exact_into(self.sock, view[first:], deadline)
            self._handle(bytes(prefix), deadline)
        finally:
            with self._lock:
                self._busy = False
                self.last_active = time.monotonic()
        return True

    def _recv_meta(self, n: int, mac: Any, deadline: float) -> bytes:
        """Read `n` metadata bytes, feeding the MAC as they arrive."""
        buf = bytearray(n)
        view = memoryview(buf)
        for start in range(0, n, _META_CHUNK):
            part = view[start : start + _META_CHUNK]
            recv_exact_into(self.sock, part, deadline)
            mac.update(part)
        return bytes(buf)

    def _handle(self, prefix: bytes, deadline: float) -> None:
        srv = self.server
        try:
            h = p.unpack_header(prefix)
            op = p.check_request_header(h, srv.info.max_bulk_len, self.authenticated)
        except FrameError as exc:
            srv.counters["frame_errors"] += 1
            self._error(None, exc.status, str(exc))
            raise _Closed from None
        deadline += (h.meta_len + h.bulk_len) / MIN_RATE
        mac = self.session.start(prefix[: p.HEADER_SIZE])
        meta = self._recv_meta(h.meta_len, mac, deadline)
        if not Signer.check(mac, prefix[p.HEADER_SIZE :]):
            srv.counters["auth_errors"] += 1
            if op is Op.AUTH:
                why = "AUTH does not answer this connection's challenge (replayed, or wrong key)"
            else:
                why = "request MAC does not verify (wrong auth key)"
            self._error(h, Status.BAD_MAC, why)
            raise _Closed
        if srv.clock.check(h.timestamp_ns) is not Status.OK:
            srv.counters["auth_errors"] += 1
            skew = (h.timestamp_ns - time.time_ns()) / 1e9
            self._error(h, Status.CLOCK_DRIFT, f"clock skew {skew:+.3f}s")
            raise _Closed
        if self.challenge is not None and h.request_id != (self._last_id + 1) & 0xFFFFFFFF:
            srv.counters["auth_errors"] += 1
            self._error(h, Status.REPLAY, f"request id {h.request_id} out of sequence")
            raise _Closed
        self._last_id = h.request_id
        srv.counters["requests"] += 1
        try:
            self._handlers[op](h, meta, deadline)
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
        return out + self._reply_signer.sign(out, meta) + meta

    def _send(self, data: bytes, deadline: float) -> None:
        arm(self.sock, deadline)
        self.sock.sendall(data)

    def _error(self, h: Header | None, status: Status, message: str) -> None:
        log.info("memkv: %s: %s: %s; closing", self.peer, status.name, message)
        h = h or Header(p.VERSION, 0, 0, 0, 0, 0, 0, 0)
        with contextlib.suppress(OSError):
            self._send(self._reply(h, message.encode(), 0, status), self._deadline())

    # --- operations ---------------------------------------------------------------------

    def _hello(self, h: Header, meta: bytes, deadline: float) -> None:
        if self.challenge is not None:
            raise FrameError(Status.INVALID_REQUEST, "second HELLO on one connection")
        lo, hi, client_nonce = p.decode_hello(meta)
        version = min(hi, p.MAX_VERSION)
        if version < max(lo, p.MIN_VERSION):
            self._error(
                h,
                Status.UNSUPPORTED_VERSION,
                f"client speaks {lo}..{hi}, server {p.MIN_VERSION}..{p.MAX_VERSION}",
            )
            raise _Closed
        srv = self.server
        challenge = secrets.token_bytes(p.NONCE_SIZE)
        info = srv.info
        reply = p.ServerInfo(
            version, info.max_key_len, info.max_batch_items, info.max_meta_len,
            info.max_value_len, info.max_bulk_len, info.rdma, info.server_id, info.xfer,
            srv.boot_nonce, challenge, info.idle_timeout_ms,
        )  # fmt: skip
        self._reply_signer = srv.signer.hello_reply(client_nonce)
        self._send(self._reply(h, p.encode_hello_reply(reply)), deadline)
        self.challenge = challenge
        self.session = self._reply_signer = srv.signer.session(
            client_nonce, srv.boot_nonce, challenge
        )

    def _auth(self, h: Header, meta: bytes, deadline: float) -> None:
        """The frame's MAC, under the session key, verified: the challenge is answered."""
        if self.challenge is None:
            raise FrameError(Status.INVALID_REQUEST, "AUTH before HELLO")
        if p.decode_auth(meta) != self.challenge:
            raise FrameError(Status.INVALID_REQUEST, "AUTH echoes another challenge")
        # Authenticated before the reply leaves: a client that has its answer must never
        # be closed as unauthenticated to make room.
        self.authenticated = True
        self._send(self._reply(h, b""), deadline)

    def _exists(self, h: Header, meta: bytes, deadline: float) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        flags = [int(f) for f in self.store.exists(keys)]
        self._send(self._reply(h, p.encode_flags(flags)), deadline)

    def _delete(self, h: Header, meta: bytes, deadline: float) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        codes = [Status.OK if self.store.delete(k) else Status.NOT_FOUND for k in keys]
        self._send(self._reply(h, p.encode_flags(codes)), deadline)

    def _size(self, h: Header, meta: bytes, deadline: float) -> None:
        keys = p.decode_keys(meta, self.server.max_batch_items)
        out = []
        for k in keys:
            n = self.store.size(k)
            out.append((Status.NOT_FOUND, 0) if n is None else (Status.OK, n))
        self._send(self._reply(h, p.encode_status_lengths(out)), deadline)

    def _stats(self, h: Header, meta: bytes, deadline: float) -> None:
        if meta:
            raise FrameError(Status.INVALID_REQUEST, "STATS takes no metadata")
        self._send(self._reply(h, json.dumps(self.server.stats()).encode()), deadline)

    def _drain(self, n: int, deadline: float) -> None:
        while n:
            k = min(n, len(_DRAIN))
            recv_exact_into(self.sock, _DRAIN[:k], deadline)
            n -= k

    def _put(self, h: Header, meta: bytes, deadline: float) -> None:
        items = p.decode_put_items(meta, self.server.max_batch_items)
        if sum(n for _, n, _ in items) != h.bulk_len:
            raise FrameError(Status.INVALID_REQUEST, "bulk_len does not match item lengths")
        codes: list[int] = []
        for key, n, digest in items:
            res = self.store.reserve(key, n)
            if isinstance(res, Status):
                self._drain(n, deadline)
                codes.append(res)
                continue
            try:
                recv_views_into(self.sock, res.views, batch_wakeups=True, deadline=deadline)
            except BaseException:
                self.store.abort(res)
                raise
            if value_digest(res.views) != digest:
                self.store.abort(res)
                codes.append(Status.BAD_MAC)
                continue
            self.store.commit(res, digest)
            codes.append(Status.OK)
        self._send(self._reply(h, p.encode_flags(codes)), deadline)

    def _pin_for_read(
        self, items: list[tuple[bytes, int]]
    ) -> tuple[list[tuple[Entry, int | None]], list[tuple[int, int, bytes]]]:
        """Pin each value to send, with an open descriptor for a spilled one (opened now,
        so a lost file is a miss in the reply, never a broken stream)."""
        pinned: list[tuple[Entry, int | None]] = []
        out: list[tuple[int, int, bytes]] = []
        for key, n in items:
            e = self.store.pin(key)
            fd = None
            if e is not None and e.length == n and e.path is not None:
                fd = self.store.open_spilled(e)
                if fd is None:
                    self.store.unpin(e)
                    e = None
            if e is None:
                out.append((Status.NOT_FOUND, 0, p.NO_DIGEST))
            elif e.length != n:
                self.store.unpin(e)
                out.append((Status.SIZE_MISMATCH, e.length, p.NO_DIGEST))
            else:
                pinned.append((e, fd))
                out.append((Status.OK, n, e.digest))
        return pinned, out

    def _get(self, h: Header, meta: bytes, deadline: float) -> None:
        items = p.decode_key_lengths(meta, self.server.max_batch_items)
        pinned, out = self._pin_for_read(items)
        try:
            bulk = sum(e.length for e, _ in pinned)
            deadline = self._deadline(bulk)  # a slow reader holds these pins no longer
            head = self._reply(h, p.encode_get_reply(out), bulk)
            self._send(head, deadline)
            for e, fd in pinned:
                if fd is not None:
                    self._send_file(fd, e.length, deadline)
                else:
                    send_views(self.sock, b"", self.store.views(e), deadline)
        finally:
            for e, fd in pinned:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self.store.unpin(e)

    def _send_file(self, fd: int, length: int, deadline: float) -> None:
        arm(self.sock, deadline)
        with os.fdopen(fd, "rb", closefd=False) as f:
            sent = self.sock.sendfile(f, 0, length)
        if sent != length:
            raise TransportError("spill file shorter than its value")

    # --- RDMA control (bulk moves by one-sided verbs; see .rdma) ---------

    def _require_rdma(self) -> Any:
        if self.server.rdma is None:
            raise FrameError(Status.UNSUPPORTED, "this server has no RDMA device")
        return self.server.rdma

    def _rdma_connect(self, h: Header, meta: bytes, deadline: float) -> None:
        responder = self._require_rdma()
        if self.rdma_peer is not None:
            self.rdma_peer.close()
        self.rdma_peer, reply = responder.accept(meta)
        self._send(self._reply(h, reply), deadline)

    def _rdma_put(self, h: Header, meta: bytes, deadline: float) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_PUT before RDMA_CONNECT")
        items = p.decode_remote_items(meta, self.server.max_batch_items)
        codes = self.rdma_peer.serve_put(self.store, items)
        self._send(self._reply(h, p.encode_flags(codes)), deadline)

    def _rdma_get(self, h: Header, meta: bytes, deadline: float) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_GET before RDMA_CONNECT")
        items = p.decode_remote_items(meta, self.server.max_batch_items)
        out = self.rdma_peer.serve_get(self.store, items)
        self._send(self._reply(h, p.encode_status_lengths(out)), deadline)

    def _rdma_xfer(self, h: Header, meta: bytes, deadline: float) -> None:
        self._require_rdma()
        if self.rdma_peer is None:
            raise FrameError(Status.INVALID_REQUEST, "RDMA_XFER before RDMA_CONNECT")
        is_write, items = p.decode_xfer(meta, self.server.max_batch_items)
        out = self.rdma_peer.serve_xfer(self.store, is_write, items)
        self._send(self._reply(h, p.encode_status_lengths(out)), deadline)
