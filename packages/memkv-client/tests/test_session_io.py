"""The socket helpers under the zero-copy paths: scatter receive into many views."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
from memkv_client import TransportError
from memkv_client.session import recv_views_into


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
