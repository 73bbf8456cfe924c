"""Blocking socket I/O shared by client sessions and the server: `host:port` parsing,
exact reads, scatter reads into many buffers, gathered sends. No protocol knowledge."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import time
from collections.abc import Sequence

from .errors import TransportError

__all__ = [
    "arm",
    "is_loopback",
    "parse_address",
    "recv_exact",
    "recv_exact_into",
    "recv_views_into",
    "send_views",
]


def parse_address(text: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """Split `host:port` (IPv6 as `[addr]:port`); raises ValueError."""
    host, sep, port_s = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_s!r} is not a number") from None
    if not (0 if allow_port_zero else 1) <= port < 65536:
        raise ValueError(f"{text!r}: port {port} out of range 1..65535")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_IOV_MAX = 128  # buffers per recvmsg_into call (Linux allows 1024)
_LOWAT_MAX = 1 << 20  # largest SO_RCVLOWAT recv_views_into sets
_LOWAT_MIN = 128 << 10  # below this it leaves the mark at 1


def arm(sock: socket.socket, deadline: float | None) -> None:
    """Make the next blocking call on `sock` time out at `deadline` (monotonic
    seconds; None leaves the timeout alone). Raises TimeoutError if it has passed."""
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(left)


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill `view` completely from `sock` by `deadline`; EOF raises
    `TransportError`, a passed deadline TimeoutError."""
    got, n = 0, len(view)
    while got < n:
        arm(sock, deadline)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TransportError("connection closed by peer mid-frame")
        got += k


def recv_views_into(
    sock: socket.socket,
    views: Sequence[memoryview],
    *,
    batch_wakeups: bool = False,
    deadline: float | None = None,
) -> None:
    """Fill every view in order, as many per syscall as the socket has data for, by
    `deadline` (monotonic seconds) if one is given.

    One `recvmsg_into` scatters the stream over up to `_IOV_MAX` views, so a value
    held in many blocks (or several values of one reply) costs a few large copies
    instead of one syscall per block. EOF raises `TransportError`.

    `batch_wakeups` (for large values): raise `SO_RCVLOWAT` so a call returns once
    about `_LOWAT_MAX` bytes are there instead of as soon as any are (fewer wakeups per
    byte; docs/benchmarks.md has the measurement). The mark is at most half of the bytes still to
    come for these views, so the data that wakes the reader is always on its way: a
    blocking reader that copied part of what it waits for still sees the mark reached
    by the rest. It is reset to 1 before returning.
    """
    pending = [v for v in views if len(v)]
    if not pending:
        return
    remaining = sum(len(v) for v in pending)
    i, last = 0, len(pending) - 1
    first = pending[0]
    lowat = 1
    try:
        while True:
            if batch_wakeups:
                want = min(_LOWAT_MAX, remaining // 2)
                want = want if want >= _LOWAT_MIN else 1
                if want != lowat:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                    lowat = want
            arm(sock, deadline)
            got = sock.recvmsg_into([first, *pending[i + 1 : i + _IOV_MAX]])[0]
            if got == 0:
                raise TransportError("connection closed by peer mid-frame")
            remaining -= got
            while got >= len(first):
                if i == last:
                    return
                got -= len(first)
                i += 1
                first = pending[i]
            first = first[got:]
    finally:
        if lowat != 1:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    buf = bytearray(n)
    if n:
        recv_exact_into(sock, memoryview(buf), deadline)
    return buf


def send_views(
    sock: socket.socket,
    head: bytes,
    views: Sequence[memoryview],
    deadline: float | None = None,
) -> None:
    """Send the frame prefix then every bulk view (no joining, no copies of bulk data),
    all of it by `deadline` (monotonic seconds) if one is given."""
    first = views[0] if views else memoryview(b"")
    if len(first) <= 65536:  # small values ride with the header in one syscall
        arm(sock, deadline)
        sock.sendall(head + first)
    else:
        arm(sock, deadline)
        sock.sendall(head)
        arm(sock, deadline)
        sock.sendall(first)
    for v in views[1:]:
        arm(sock, deadline)
        sock.sendall(v)
