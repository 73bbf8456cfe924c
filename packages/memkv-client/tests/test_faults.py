"""Server killed mid-batch, wrong keys, replays, clock drift."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from conftest import KEY, ServerProcess, make_client, wait_until
from memkv_client import BadMacError, ResultKind
from memkv_client import protocol as p
from memkv_client.auth import Signer


def _rx_queued(port: int) -> bool:
    """True if some connection to ``port`` has bytes waiting in the server's receive queue."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, queues = fields[1], fields[4]
            if int(local.split(":")[1], 16) == port and int(queues.split(":")[1], 16) > 0:
                return True
    return False


def _run_in_thread(fn: object) -> tuple[threading.Thread, list[object]]:
    box: list[object] = []
    th = threading.Thread(target=lambda: box.append(fn()))  # type: ignore[operator]
    th.start()
    return th, box


def test_server_killed_mid_batch_then_recovers(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    c = make_client(srv.address, num_connections=2, max_batch_size=2)
    assert c.warmup() == []
    value = bytearray(os.urandom(1 << 20))
    # Freeze the server so the batch is certainly in flight when it dies.
    srv.freeze()
    items = [(f"kill/{i}", value, len(value)) for i in range(12)]
    th, box = _run_in_thread(lambda: c.batch_put_views(items))
    assert wait_until(lambda: _rx_queued(srv.port), attempts=200), "batch never reached the server"
    srv.kill()
    th.join(60)
    assert not th.is_alive()
    (results,) = box
    assert isinstance(results, list)
    assert len(results) == 12
    assert {r.kind for r in results} == {ResultKind.TRANSPORT}
    assert all(srv.address in r.cause for r in results)

    # Down: exists reports absent rather than raising; reads report transport errors.
    assert c.exists(["kill/0"]) == [False]
    (r,) = c.batch_get_into([("kill/0", bytearray(1), 1)])
    assert r.kind is ResultKind.TRANSPORT

    srv.start()  # same port

    def recovered() -> bool:
        return bool(c.batch_put_views([("kill/after", value, len(value))])[0].ok)

    assert wait_until(recovered, attempts=60, delay=0.1)
    out = bytearray(len(value))
    assert c.batch_get_into([("kill/after", out, len(out))])[0].ok
    assert out == value
    c.close()


def test_server_killed_mid_get(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    c = make_client(srv.address, num_connections=1)
    value = os.urandom(4 << 20)
    assert all(c.batch_put_views([(f"g/{i}", value, len(value)) for i in range(4)]))
    assert srv.proc is not None
    outs = [bytearray(len(value)) for _ in range(4)]
    srv.freeze()
    th, box = _run_in_thread(
        lambda: c.batch_get_into([(f"g/{i}", o, len(o)) for i, o in enumerate(outs)])
    )
    assert wait_until(lambda: _rx_queued(srv.port), attempts=200)
    srv.kill()
    th.join(60)
    (results,) = box
    assert isinstance(results, list)
    assert all(r.kind is ResultKind.TRANSPORT for r in results)
    c.close()


def test_wrong_auth_key_is_rejected(server: ServerProcess) -> None:
    with make_client(server.address, auth_key="22" * 32) as bad:
        with pytest.raises(BadMacError, match="MAC"):
            bad.exists_on(0, ["x"])
        (r,) = bad.batch_put_views([("auth/x", b"v", 1)])
        assert r.kind is ResultKind.SERVER
        assert "BAD_MAC" in r.cause
        with pytest.raises(BadMacError):
            bad.put("auth/x", b"v")
    with make_client(server.address) as good:  # the server is unharmed
        assert good.exists(["auth/x"]) == [False]


def _frame(signer: Signer, op: p.Op, meta: bytes, ts: int | None = None, rid: int = 7) -> bytes:
    ts = time.time_ns() if ts is None else ts
    header = p.Header(p.VERSION, op, 0, 0, rid, ts, len(meta), 0).pack()
    return header + signer.sign(header, meta) + meta


def _exchange(address: str, data: bytes) -> p.Frame | None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    dec = p.FrameDecoder()
    dec.feed(buf)
    return dec.next_frame()


def test_replayed_request_is_rejected(server: ServerProcess) -> None:
    frame = _frame(Signer(KEY), p.Op.EXISTS, p.encode_keys([b"replay/k"]))
    first = _exchange(server.address, frame)
    assert first is not None
    assert first.header.status == p.Status.OK
    again = _exchange(server.address, frame)
    assert again is not None
    assert again.header.status == p.Status.REPLAY
    assert b"already seen" in again.meta


def test_clock_drift_is_rejected(server: ServerProcess) -> None:
    old = time.time_ns() - 3600 * 10**9
    reply = _exchange(server.address, _frame(Signer(KEY), p.Op.EXISTS, p.encode_keys([b"k"]), old))
    assert reply is not None
    assert reply.header.status == p.Status.CLOCK_DRIFT
    assert b"skew" in reply.meta


def test_replies_are_signed_by_the_server(server: ServerProcess) -> None:
    signer = Signer(KEY)
    reply = _exchange(server.address, _frame(signer, p.Op.HELLO, p.encode_hello()))
    assert reply is not None
    assert signer.verify(reply.header.pack(), reply.meta, reply.mac)
    assert not Signer(b"\x22" * 32).verify(reply.header.pack(), reply.meta, reply.mac)


def test_version_negotiation(server: ServerProcess) -> None:
    signer = Signer(KEY)
    reply = _exchange(server.address, _frame(signer, p.Op.HELLO, p.encode_hello(1, 3)))
    assert reply is not None
    assert reply.header.status == p.Status.OK
    assert p.decode_hello_reply(reply.meta).version == 1
    reply = _exchange(server.address, _frame(signer, p.Op.HELLO, p.encode_hello(2, 3)))
    assert reply is not None
    assert reply.header.status == p.Status.UNSUPPORTED_VERSION
    assert b"server 1..1" in reply.meta
    meta = p.encode_keys([b"k"])
    header = p.Header(2, p.Op.EXISTS, 0, 0, 1, time.time_ns(), len(meta), 0).pack()
    reply = _exchange(server.address, header + signer.sign(header, meta) + meta)
    assert reply is not None
    assert reply.header.status == p.Status.UNSUPPORTED_VERSION


def test_down_server_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    from conftest import free_port

    caplog.set_level("WARNING", logger="memkv_client")
    with make_client(f"127.0.0.1:{free_port()}") as c:  # nothing listens there
        for _ in range(5):
            assert c.exists(["a", "b"]) == [False, False]
    warnings = [r for r in caplog.records if "reported as absent" in r.getMessage()]
    assert len(warnings) == 1
    assert "connect failed" in warnings[0].getMessage()


def test_frozen_server_times_out_then_recovers(fresh_server: ServerProcess) -> None:
    srv = fresh_server
    assert srv.proc is not None
    with make_client(srv.address, num_connections=1, request_timeout_ms=300) as c:
        c.put("frz/a", b"1")
        srv.freeze()
        try:
            (r,) = c.batch_get_into([("frz/a", bytearray(1), 1)])
            assert r.kind is ResultKind.TRANSPORT
            assert "timed out" in r.cause
            assert c.exists(["frz/a"]) == [False]  # unreachable reads as absent
        finally:
            srv.thaw()
        assert wait_until(lambda: c.exists(["frz/a"]) == [True], attempts=50, delay=0.1)
        assert c.get("frz/a") == b"1"


def test_peer_resetting_connections_yields_transport_results() -> None:
    """A listener that resets every connection: errors surface as results, never raw."""
    import struct

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stop = threading.Event()

    def reset_everything() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # RST

    th = threading.Thread(target=reset_everything)
    th.start()
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with make_client(address, num_connections=2, max_batch_size=1) as c:
            for _ in range(5):
                results = c.batch_put_views([(f"rst/{i}", b"v", 1) for i in range(4)])
                assert [r.kind for r in results] == [ResultKind.TRANSPORT] * 4
                assert c.exists(["rst/0"]) == [False]
                outs = [bytearray(1) for _ in range(4)]
                got = c.batch_get_into([(f"rst/{i}", o, 1) for i, o in enumerate(outs)])
                assert [r.kind for r in got] == [ResultKind.TRANSPORT] * 4
    finally:
        stop.set()
        th.join(10)
        listener.close()


def test_reset_between_connect_and_hello_is_a_transport_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server dies after the kernel accepted the connection, before HELLO is sent."""
    import select

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # never accepts: connections complete in the kernel's backlog
    real = socket.create_connection

    def connect_then_reset(*args: object, **kwargs: object) -> socket.socket:
        sock = real(*args, **kwargs)  # type: ignore[arg-type]
        listener.close()  # resets the queued connection
        assert select.select([sock], [], [], 10)[0], "no reset arrived"
        return sock

    monkeypatch.setattr(socket, "create_connection", connect_then_reset)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    with make_client(address, num_connections=1) as c:
        (r,) = c.batch_put_views([("rst/x", b"v", 1)])
        assert r.kind is ResultKind.TRANSPORT
        assert address in r.cause
