"""The socket helpers under the zero-copy paths: scatter receive into many views."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from memkv_client import TransportError
from memkv_client.sockio import recv_views_into


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def _send_in_pieces(sock: socket.socket, data: bytes, piece: int) -> threading.Thread:
    def run() -> None:
        for i in range(0, len(data), piece):
            sock.sendall(data[i : i + piece])

    th = threading.Thread(target=run)
    th.start()
    return th


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_scatter_fills_views_in_order(
    pair: tuple[socket.socket, socket.socket], piece: int
) -> None:
    a, b = pair
    sizes = [3, 0, 4096, 1, 70_000, 0, 5]
    data = os.urandom(sum(sizes))
    bufs = [bytearray(n) for n in sizes]
    th = _send_in_pieces(a, data + b"next", piece)
    recv_views_into(b, [memoryview(x) for x in bufs])
    th.join()
    assert b"".join(bufs) == data
    assert b.recv(4) == b"next"  # nothing beyond the views was consumed


def test_scatter_over_more_views_than_one_call_takes(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    bufs = [bytearray(100) for _ in range(1000)]  # more than _IOV_MAX per recvmsg_into
    data = os.urandom(100_000)
    th = _send_in_pieces(a, data, 65536)
    recv_views_into(b, [memoryview(x) for x in bufs])
    th.join()
    assert b"".join(bufs) == data


def test_scatter_eof_mid_frame(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"x" * 10)
    a.close()
    with pytest.raises(TransportError, match="closed by peer"):
        recv_views_into(b, [memoryview(bytearray(8)), memoryview(bytearray(8))])


def test_scatter_of_nothing_reads_nothing(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"z")
    recv_views_into(b, [])
    recv_views_into(b, [memoryview(bytearray(0))])
    assert b.recv(1) == b"z"


def _tcp_pair(warm: bool = False) -> tuple[socket.socket, socket.socket]:
    """A loopback TCP pair; `warm` first streams 64 MiB through it, so the receive
    buffer and window have grown the way a long-lived server connection's have (on a
    fresh pair the small window wakes a reader early and hides a bad mark)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    if warm:
        sink = memoryview(bytearray(64 << 20))
        th = threading.Thread(target=recv_views_into, args=(b, [sink]))
        th.start()
        a.sendall(sink)
        th.join()
    return a, b


@pytest.mark.parametrize("timeout", [None, 10.0])  # blocking (server) / poll (client)
@pytest.mark.parametrize(
    ("size", "piece", "pause_every"),
    [
        (3 * (1 << 20) + 5, 100_000, 7),  # pauses leave the reader mid-mark many times
        (16 << 20, 1 << 20, 3),
        (2 << 20, 2 << 20, 1),  # exactly two marks' worth, then nothing more
        (300_000, 1000, 50),  # below the smallest mark: plain receive
    ],
)
def test_batched_wakeups_complete_with_nothing_more_coming(
    size: int, piece: int, pause_every: int, timeout: float | None
) -> None:
    """The value's last byte must wake the reader: no mark waits for bytes never sent."""
    a, b = _tcp_pair(warm=True)
    b.settimeout(timeout)
    data = os.urandom(size)
    blocks = [bytearray(min(256 << 10, size - o)) for o in range(0, size, 256 << 10)]
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            recv_views_into(b, [memoryview(x) for x in blocks], batch_wakeups=True)
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=receive)
    th.start()
    try:
        for n, i in enumerate(range(0, size, piece)):
            a.sendall(data[i : i + piece])
            if n % pause_every == 0:
                time.sleep(0.01)  # the reader copies what is there and waits for more
        th.join(10)
        assert not th.is_alive(), "receiver hung waiting for data that never comes"
    finally:
        a.close()
        th.join(5)
        b.close()
    assert not errors, errors
    assert b"".join(blocks) == data


def test_batched_wakeups_reset_the_mark() -> None:
    a, b = _tcp_pair()
    with a, b:
        a.sendall(bytes(1 << 20) + b"tail")
        recv_views_into(b, [memoryview(bytearray(1 << 20))], batch_wakeups=True)
        assert b.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        assert b.recv(4) == b"tail"  # a short message after the value still wakes us
