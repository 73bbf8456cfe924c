"""Pre-authentication limits, deadlines and the connection cap (issue 15, item 1)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest
import rawclient
from conftest import KEY, ServerProcess, make_client, wait_until
from memkv_client import protocol as p
from rawclient import RawSession, read_frame


def rss(srv: ServerProcess) -> int:
    assert srv.proc is not None
    return rawclient.rss(srv.proc.pid)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` within `within` seconds (reading what it sends)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


@pytest.fixture
def strict_server() -> Iterator[ServerProcess]:
    srv = ServerProcess(
        "--memory", "64MiB", "--lanes", "1", "--frame-timeout-s", "1", "--idle-timeout-s", "2",
        "--max-connections", "16",
    ).start()  # fmt: skip
    yield srv
    srv.stop()


def test_unauthenticated_headers_allocate_nothing(strict_server: ServerProcess) -> None:
    """Headers announcing 1 MiB of metadata, followed by junk, from 150 peers without the
    key: each is answered at once and RSS does not grow (it grew ~1 MiB per peer)."""
    before = rss(strict_server)
    header = p.Header(p.MIN_VERSION, p.Op.HELLO, 0, 0, 1, time.time_ns(), p.MAX_META_LEN, 0).pack()
    junk = header + bytes(32) + b"\xab" * (512 << 10)
    socks = []
    for _ in range(15):
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", strict_server.port))
            s.setblocking(False)
            with contextlib.suppress(OSError):
                s.send(junk)
            socks.append(s)
        time.sleep(0.05)
    grown = rss(strict_server) - before
    answered = 0
    for s in socks:
        s.setblocking(True)
        s.settimeout(5)
        reply = read_frame(s)
        answered += reply is not None and reply.header.status != p.Status.OK
        s.close()
    assert grown < 16 << 20, f"RSS grew {grown >> 20} MiB"
    assert answered >= 100  # the rest may see a reset instead of the error frame


def test_silent_and_idle_connections_are_closed(strict_server: ServerProcess) -> None:
    silent = socket.create_connection(("127.0.0.1", strict_server.port))
    idle = RawSession(strict_server.port, KEY)
    t0 = time.monotonic()
    assert closed_by_server(silent, 5)
    assert time.monotonic() - t0 < 3  # --frame-timeout-s 1 before HELLO
    assert closed_by_server(idle.sock, 5)  # --idle-timeout-s 2 after
    silent.close()
    idle.close()
    with make_client(strict_server.address) as c:
        assert c.stats()["deadline_closes"] >= 2


def test_slowloris_frame_is_cut_off(strict_server: ServerProcess) -> None:
    s = RawSession(strict_server.port, KEY)
    data = s.next_frame(p.Op.EXISTS, p.encode_keys([b"k"]))
    t0 = time.monotonic()
    with contextlib.suppress(OSError):
        for byte in data:  # one byte every 0.2 s: each read makes progress, the frame does not
            s.sock.send(bytes([byte]))
            time.sleep(0.2)
            if time.monotonic() - t0 > 6:
                break
    assert closed_by_server(s.sock, 2)
    assert time.monotonic() - t0 < 6
    s.close()


def test_connection_cap_makes_room_by_closing_unauthenticated_peers() -> None:
    # a long frame deadline, so only the cap (never a deadline) closes connections here
    capped = ServerProcess(
        "--memory", "16MiB", "--frame-timeout-s", "60", "--max-connections", "16"
    )
    capped.start()
    try:
        _fill_and_check(capped)
    finally:
        capped.stop()


def _fill_and_check(srv: ServerProcess) -> None:
    squatters = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(16)]
    # Each valid client still gets in: the server closes the oldest squatter for it. (No
    # client that leaves again here: the server may see its close only later, and then
    # make room for the next session by closing a squatter it did not need to.)
    sessions = [RawSession(srv.port, KEY) for _ in range(16)]  # all authenticated
    assert all(closed_by_server(s, 10) for s in squatters)
    sessions[0].request(p.Op.EXISTS, p.encode_keys([b"k"]))  # sessions[1] is now idle longest
    extra = RawSession(srv.port, KEY)  # nothing unauthenticated is left: an idle one gives way
    assert closed_by_server(sessions[1].sock, 10)
    reply = sessions[0].request(p.Op.STATS, b"")
    assert reply is not None
    stats = json.loads(reply.meta)
    assert stats["max_connections"] == 16
    assert stats["refused_connections"] == 0
    assert stats["unauthenticated_closed"] >= 16
    assert stats["idle_closed"] == 1
    for s in squatters:
        s.close()
    for rs in [*sessions, extra]:
        rs.close()


def test_stalled_reader_releases_its_pins_after_the_deadline(strict_server: ServerProcess) -> None:
    """Three GETs of 12 MiB values whose replies are never read: after the reply deadline
    (1 s + 12 MiB at 8 MiB/s) the pins go, so the memory can be reused."""
    value = b"\x5a" * (12 << 20)
    with make_client(strict_server.address) as c:
        for k in ("pin/a", "pin/b", "pin/c"):
            c.put(k, value)
    readers = []
    for k in (b"pin/a", b"pin/b", b"pin/c"):
        raw = RawSession(strict_server.port, KEY, rcvbuf=4096)
        raw.sock.sendall(raw.next_frame(p.Op.GET, p.encode_key_lengths([(k, len(value))])))
        readers.append(raw)
    time.sleep(4)
    with make_client(strict_server.address) as c:
        for k in ("pin/a", "pin/b", "pin/c"):
            c.delete(k)
        results = c.batch_put_views([(f"pin/n{i}", value, len(value)) for i in range(5)])
        assert [r.kind.value for r in results] == ["ok"] * 5  # 60 of 64 MiB: pins are gone
        assert wait_until(lambda: c.stats()["deadline_closes"] >= 3)
    for r in readers:
        r.close()
