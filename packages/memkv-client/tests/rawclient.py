"""A raw-frame MemKV peer for tests and the hostile-client suite, written from
docs/memkv-protocol.md: it builds frames byte by byte, so it can send what the real
client never would (replays, bad MACs, out-of-order ids, truncated frames)."""

from __future__ import annotations

import secrets
import socket
import time

from memkv_client import protocol as p
from memkv_client.auth import Signer, value_digest


def frame(signer: Signer, op: int, meta: bytes, rid: int, bulk: bytes = b"", **kw: int) -> bytes:
    """One signed request frame (`version`, `ts`, `bulk_len` may be overridden)."""
    header = p.Header(
        kw.get("version", p.VERSION), op, 0, 0, rid, kw.get("ts", time.time_ns()),
        len(meta), kw.get("bulk_len", len(bulk)),
    ).pack()  # fmt: skip
    return header + signer.sign(header, meta) + meta + bulk


def read_frame(sock: socket.socket) -> p.Frame | None:
    """The next whole frame, or None at EOF/reset."""
    dec = p.FrameDecoder()
    while (f := dec.next_frame()) is None:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return None
        if not chunk:
            return None
        dec.feed(chunk)
    return f


class RawSession:
    """An authenticated connection (HELLO, then AUTH answering its challenge): `request`
    signs with the session key and the next id."""

    def __init__(
        self,
        port: int,
        key: bytes,
        timeout: float = 10.0,
        rcvbuf: int = 0,
        pause_before_auth: float = 0.0,
    ) -> None:
        """`pause_before_auth`: seconds between the HELLO reply and AUTH (a slow client)."""
        self.key = Signer(key)
        self.sock = socket.socket()
        if rcvbuf:  # before connecting, so the window never grows past it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        nonce = secrets.token_bytes(p.NONCE_SIZE)
        self.rid = secrets.randbits(31)
        self.sock.sendall(frame(self.key, p.Op.HELLO, p.encode_hello(nonce), self.rid))
        reply = read_frame(self.sock)
        assert reply is not None, "no HELLO reply"
        assert reply.header.status == p.Status.OK, reply.meta
        assert self.key.hello_reply(nonce).verify(reply.header.pack(), reply.meta, reply.mac)
        self.info = p.decode_hello_reply(reply.meta)
        self.session = self.key.session(nonce, self.info.boot_nonce, self.info.challenge)
        self.sent: list[bytes] = []  # every request frame, for replays
        time.sleep(pause_before_auth)
        reply = self.request(p.Op.AUTH, p.encode_auth(self.info.challenge))
        assert reply is not None, "no AUTH reply"
        assert reply.header.status == p.Status.OK, reply.meta
        self.sent.clear()

    def next_frame(self, op: int, meta: bytes, bulk: bytes = b"", **kw: int) -> bytes:
        self.rid = (self.rid + 1) & 0xFFFFFFFF
        data = frame(self.session, op, meta, self.rid, bulk, **kw)
        self.sent.append(data)
        return data

    def request(self, op: int, meta: bytes, bulk: bytes = b"", **kw: int) -> p.Frame | None:
        self.sock.sendall(self.next_frame(op, meta, bulk, **kw))
        return read_frame(self.sock)

    def verified(self, reply: p.Frame) -> bool:
        return self.session.verify(reply.header.pack(), reply.meta, reply.mac)

    def put(self, key: bytes, value: bytes) -> p.Frame | None:
        meta = p.encode_put_items([(key, len(value), value_digest([value]))])
        return self.request(p.Op.PUT, meta, value)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def assert_status(reply: p.Frame | None, status: p.Status, text: bytes = b"") -> None:
    """`reply` is a frame with this frame-level status whose message holds `text`."""
    assert reply is not None, "no reply"
    assert reply.header.status == status, (p.status_name(reply.header.status), reply.meta)
    assert text in reply.meta


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")
