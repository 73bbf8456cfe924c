"""One authenticated TCP connection to one server, speaking the MemKV protocol.

A session is used by one thread at a time (the pool in `.pool` hands it out).
Values move zero-copy: requests `sendall` straight from the caller's buffers and
replies `recv_into` the caller's buffers. Any failure mid-request marks the session
broken; it is then closed and never reused.

Opening: HELLO carries a random client nonce; its reply, signed under a key bound to
that nonce, carries the server's fresh challenge, which AUTH answers (signed with the
session key derived from the challenge). Every later frame is signed with that session
key, and request ids start at a random value and increase by one, each reply echoing
its request's. Value bytes are checked against the BLAKE3 digests sent with them.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import time
from collections.abc import Sequence
from typing import Any

from . import protocol as p
from .auth import Signer, value_digest
from .config import Config
from .errors import (
    MemKVError,
    MemKVTimeout,
    RemoteProtocolError,
    TransportError,
    UnsupportedVersionError,
    error_from_status,
)
from .protocol import Op, ServerInfo, Status
from .sockio import parse_address, recv_exact, recv_views_into, send_views

_MIN_RATE = 16 << 20  # bytes/s a request may take beyond request_timeout_ms to send

__all__ = ["TcpSession"]


class TcpSession:
    """A connected, version-negotiated session."""

    rdma = False  #: one-sided RDMA data path (`batch_xfer` needs it)

    def __init__(
        self,
        address: str,
        config: Config,
        signer: Signer,
        bind: str | None = None,
        deadline: float | None = None,
    ):
        self.address = address
        self._key = signer
        self._signer = signer  # the session key once HELLO is done
        self._verifier = signer  # what replies are checked with
        self._last_id = secrets.randbits(32)
        self._timeout = config.request_timeout_ms / 1000
        self.broken = False
        self.deadline = deadline  #: the current call's (monotonic s); bounds every wait
        host, port = parse_address(address)
        timeout = config.connect_timeout_ms / 1000
        if deadline is not None:  # connect, HELLO and AUTH all within it
            timeout = max(0.001, min(timeout, deadline - time.monotonic()))
        try:
            src = (bind, 0) if bind else None
            self.sock = socket.create_connection((host, port), timeout=timeout, source_address=src)
        except TimeoutError:
            raise MemKVTimeout(f"{address}: connect timed out after {timeout:g}s") from None
        except OSError as exc:
            raise TransportError(f"{address}: connect failed: {exc.strerror or exc}") from None
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.info = self._hello()
        except MemKVError:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise TransportError(f"{address}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise
        self.sock.settimeout(self._timeout)

    # --- framing ---------------------------------------------------------------------

    def _send(self, op: Op, meta: bytes, bulk: Sequence[memoryview] = ()) -> int:
        rid = self._last_id = (self._last_id + 1) & 0xFFFFFFFF
        bulk_len = sum(len(v) for v in bulk)
        header = p.Header(p.VERSION, op, 0, 0, rid, time.time_ns(), len(meta), bulk_len).pack()
        deadline = self.deadline
        if deadline is None:
            deadline = time.monotonic() + self._timeout + (len(meta) + bulk_len) / _MIN_RATE
        send_views(self.sock, header + self._signer.sign(header, meta) + meta, bulk, deadline)
        self.sock.settimeout(self._timeout)  # each read of the reply must progress this fast
        return rid

    def _recv_reply(self, op: Op, rid: int) -> tuple[p.Header, bytes]:
        prefix = recv_exact(self.sock, p.PREFIX_SIZE, self.deadline)
        try:
            h = p.unpack_header(prefix)
        except p.FrameError as exc:
            raise RemoteProtocolError(f"{self.address}: bad reply: {exc}") from None
        if h.meta_len > p.MAX_META_LEN:
            raise RemoteProtocolError(f"{self.address}: reply metadata of {h.meta_len} bytes")
        meta = bytes(recv_exact(self.sock, h.meta_len, self.deadline))
        header_bytes = bytes(prefix[: p.HEADER_SIZE])
        mac = bytes(prefix[p.HEADER_SIZE :])
        verified = self._verifier.verify(header_bytes, meta, mac)
        if not verified and h.status != Status.OK:  # errors before HELLO: the plain key
            verified = self._key.verify(header_bytes, meta, mac)
        if not verified and h.status == Status.OK:
            raise RemoteProtocolError(f"{self.address}: reply MAC does not verify (wrong key?)")
        if h.status != Status.OK:
            # An error reply is honoured even unverified (a server holding another key
            # cannot sign for us); at worst a forged one fails a request.
            message = meta.decode(errors="replace")
            if not verified:
                message += " (reply not authenticated: the server holds a different key)"
            self.broken = True  # the server closes after a frame-level error
            try:
                status = Status(h.status)
            except ValueError:
                raise RemoteProtocolError(f"unknown status {h.status}: {message}") from None
            raise error_from_status(status, f"{self.address}: {message}")
        if h.bulk_len and op is not Op.GET:
            raise RemoteProtocolError(f"{self.address}: unexpected bulk data in a {op.name} reply")
        if not h.is_response or h.op != op or h.request_id != rid:
            raise RemoteProtocolError(
                f"{self.address}: reply op={h.op:#x} id={h.request_id} does not match "
                f"request op={op:#x} id={rid}"
            )
        return h, meta

    def call(self, op: Op, meta: bytes, bulk: Sequence[memoryview] = ()) -> tuple[p.Header, bytes]:
        """Send one request and read the reply prefix; bulk reply data is left unread."""
        if self.broken:
            raise TransportError(f"{self.address}: session is closed")
        try:
            rid = self._send(op, meta, bulk)
            return self._recv_reply(op, rid)
        except TransportError as exc:
            self._fail()
            if str(exc).startswith(self.address):
                raise
            raise type(exc)(f"{self.address}: {exc}") from None
        except MemKVError:
            self._fail()  # server-side frame errors also close the connection
            raise
        except TimeoutError:
            self._fail()
            raise MemKVTimeout(f"{self.address}: request timed out") from None
        except OSError as exc:
            self._fail()
            raise TransportError(f"{self.address}: {exc.strerror or exc}") from None

    def _fail(self) -> None:
        self.broken = True
        self.close()

    def _hello(self) -> ServerInfo:
        """HELLO, then AUTH answering the reply's challenge; the negotiated server info."""
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        self._verifier = self._key.hello_reply(nonce)
        step = "HELLO"
        try:
            rid = self._send(Op.HELLO, p.encode_hello(nonce))
            _, meta = self._recv_reply(Op.HELLO, rid)
            try:
                info = p.decode_hello_reply(meta)
            except p.FrameError as exc:
                raise RemoteProtocolError(f"{self.address}: bad HELLO reply: {exc}") from None
            if not p.MIN_VERSION <= info.version <= p.MAX_VERSION:
                raise UnsupportedVersionError(
                    Status.UNSUPPORTED_VERSION, f"server chose {info.version}"
                )
            self._signer = self._verifier = self._key.session(
                nonce, info.boot_nonce, info.challenge
            )
            step = "AUTH"
            rid = self._send(Op.AUTH, p.encode_auth(info.challenge))
            self._recv_reply(Op.AUTH, rid)
        except TimeoutError:
            raise MemKVTimeout(f"{self.address}: {step} timed out") from None
        except OSError as exc:
            raise TransportError(f"{self.address}: {step} failed: {exc}") from None
        return info

    def _decode(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except p.FrameError as exc:
            self._fail()
            raise RemoteProtocolError(f"{self.address}: bad reply metadata: {exc}") from None

    # --- operations --------------------------------------------------------------------

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        _, meta = self.call(Op.EXISTS, p.encode_keys(keys))
        return [bool(f) for f in self._decode(p.decode_flags, meta, len(keys))]

    def delete(self, keys: Sequence[bytes]) -> list[int]:
        _, meta = self.call(Op.DELETE, p.encode_keys(keys))
        return list(self._decode(p.decode_flags, meta, len(keys)))

    def size(self, keys: Sequence[bytes]) -> list[tuple[int, int]]:
        _, meta = self.call(Op.SIZE, p.encode_keys(keys))
        return list(self._decode(p.decode_status_lengths, meta, len(keys)))

    def stats(self) -> dict[str, Any]:
        _, meta = self.call(Op.STATS, b"")
        try:
            result: dict[str, Any] = json.loads(meta)
        except ValueError:
            self._fail()
            raise RemoteProtocolError(f"{self.address}: STATS reply is not JSON") from None
        return result

    def put(self, items: Sequence[tuple[bytes, memoryview]]) -> list[int]:
        """Store values; per-item wire statuses in order.

        Values over the server's advertised limit are not sent: they get VALUE_TOO_LARGE.
        """
        limit = self.info.max_value_len
        send = [i for i, (_, v) in enumerate(items) if len(v) <= limit]
        codes = [int(Status.VALUE_TOO_LARGE)] * len(items)
        if not send:
            return codes
        meta = p.encode_put_items(
            [(items[i][0], len(items[i][1]), value_digest([items[i][1]])) for i in send]
        )
        _, reply = self.call(Op.PUT, meta, [items[i][1] for i in send])
        for i, code in zip(send, self._decode(p.decode_flags, reply, len(send)), strict=True):
            codes[i] = code
        return codes

    def get_into(self, items: Sequence[tuple[bytes, memoryview]]) -> list[tuple[int, int]]:
        """Read values full-length-or-miss into the views; per-item (status, stored length).

        A value whose bytes do not match the digest the server sent is `BAD_MAC` (its
        buffer content is then unspecified).
        """
        meta = p.encode_key_lengths([(k, len(v)) for k, v in items])
        h, reply = self.call(Op.GET, meta)
        replies: list[tuple[int, int, bytes]] = self._decode(p.decode_get_reply, reply, len(items))
        ok = [
            v for (_, v), (status, _, _) in zip(items, replies, strict=True) if status == Status.OK
        ]
        expected = sum(len(v) for v in ok)
        if h.bulk_len != expected:
            self._fail()
            raise RemoteProtocolError(f"{self.address}: bulk {h.bulk_len} != {expected}")
        try:
            recv_views_into(self.sock, ok, batch_wakeups=True, deadline=self.deadline)
        except TimeoutError:
            self._fail()
            raise MemKVTimeout(f"{self.address}: timed out reading values") from None
        except OSError as exc:
            self._fail()
            raise TransportError(f"{self.address}: {exc.strerror or exc}") from None
        out = []
        for (_, view), (status, n, digest) in zip(items, replies, strict=True):
            if status == Status.OK and value_digest([view]) != digest:
                status = Status.BAD_MAC
            out.append((status, n))
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
