"""The opening handshake against replays: a real client's opening bytes, captured on the
wire by a recording proxy and replayed, never authenticate a connection, on any server,
and a flood of replayed openings never locks a valid client out of a full server.

Each test starts its own `memkv serve` processes on 127.0.0.1; the flood is bounded
(200 connections) and runs in a few seconds.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import ServerProcess, make_client
from memkv_client import protocol as p

FLOOD = 200
MAX_CONNECTIONS = 64


class RecordingProxy:
    """Forwards one loopback client to a server and records the bytes the client sent."""

    def __init__(self, server_port: int) -> None:
        self._server_port = server_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.sent = bytearray()  # client -> server, first connection only
        self._threads: list[threading.Thread] = []
        self._accepted = threading.Thread(target=self._accept, daemon=True)
        self._accepted.start()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self._server_port))
        for src, dst, record in ((client, upstream, True), (upstream, client, False)):
            th = threading.Thread(target=self._pump, args=(src, dst, record), daemon=True)
            th.start()
            self._threads.append(th)

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if record:
                    self.sent += chunk
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        for th in self._threads:
            th.join(10)


def _frames(data: bytes) -> list[bytes]:
    """Split a recorded byte stream into its frames, byte for byte."""
    dec = p.FrameDecoder()
    dec.feed(data)
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f.header.pack() + f.mac + f.meta + f.bulk)
    return out


def _capture(srv: ServerProcess) -> tuple[list[bytes], bytes]:
    """A real client's opening frames (everything before its first PUT) and that PUT."""
    proxy = RecordingProxy(srv.port)
    try:
        with make_client(f"127.0.0.1:{proxy.port}", num_connections=1) as c:
            c.put("replay/balance", b"balance=100")
    finally:
        proxy.close()
    frames = _frames(bytes(proxy.sent))
    first_put = next(i for i, f in enumerate(frames) if p.unpack_header(f).op == p.Op.PUT)
    assert first_put >= 1, "no opening before the first PUT"
    return frames[:first_put], frames[first_put]


def _replay(port: int, data: bytes, timeout: float) -> tuple[list[p.Frame], bool]:
    """Send `data` on a new connection; the reply frames and whether the server closed
    the connection within `timeout` seconds."""
    dec = p.FrameDecoder()
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                dec.feed(chunk)
            closed = True
        closed = closed or s.fileno() == -1
    frames = []
    while (f := dec.next_frame()) is not None:
        frames.append(f)
    return frames, closed


@pytest.fixture
def servers() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two servers with the same key and deadlines long enough never to be what closes."""
    args = ("--memory", "16MiB", "--frame-timeout-s", "30")
    a = ServerProcess(*args).start()
    b = ServerProcess(*args).start()
    yield a, b
    a.stop()
    b.stop()


def test_a_replayed_opening_never_authenticates(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    """Within the clock window, on the server it was captured from and on another one
    with the same key: the replayed opening is refused with BAD_MAC and the connection
    closed at once, and the replayed PUT behind it is never executed."""
    a, b = servers
    opening, put = _capture(a)
    with make_client(a.address) as c:
        c.put("replay/balance", b"balance=0")
    for srv in (a, b):
        t0 = time.monotonic()
        replies, closed = _replay(srv.port, b"".join(opening) + put, timeout=5)
        took = time.monotonic() - t0
        statuses = [p.status_name(f.header.status) for f in replies]
        print(f"replayed opening to {srv.address}: replies {statuses}, closed after {took:.2f}s")
        assert closed, f"the replayed opening holds a live connection (replies {statuses})"
        assert statuses[-1] == "BAD_MAC", statuses
        assert "OK" not in statuses[len(opening) - 1 :], statuses
    with make_client(a.address) as c:
        assert c.get("replay/balance") == b"balance=0"


def test_replayed_openings_never_lock_out_a_valid_client() -> None:
    """200 replayed openings held open at --max-connections 64: a valid client still gets
    in at once (the issue's bar for its put+get is 100 ms; printed, not asserted)."""
    srv = ServerProcess(
        "--memory", "16MiB", "--max-connections", str(MAX_CONNECTIONS), "--frame-timeout-s", "30",
    ).start()  # fmt: skip
    flood: list[socket.socket] = []
    try:
        opening, _ = _capture(srv)
        for i in range(FLOOD):  # every other one stops after the HELLO and waits
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            with contextlib.suppress(OSError):
                s.sendall(b"".join(opening) if i % 2 else opening[0])
            flood.append(s)
        t0 = time.monotonic()
        with make_client(srv.address, num_connections=1, connect_timeout_ms=5000) as c:
            c.put("flood/k", b"still served")
            got = c.get("flood/k")
            took = time.monotonic() - t0
            stats = c.stats()
        print(
            f"\nafter {FLOOD} replayed openings at --max-connections {MAX_CONNECTIONS}: "
            f"a new client's first put+get took {took * 1000:.1f} ms "
            f"(unauthenticated_closed={stats['unauthenticated_closed']}, "
            f"refused={stats['refused_connections']})"
        )
        assert got == b"still served"
        assert stats["refused_connections"] == 0
    finally:
        for s in flood:
            s.close()
        srv.stop()
    assert "Traceback" not in "".join(srv.output)
