"""Server killed mid-batch, wrong keys, replays, clock drift."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest
from conftest import KEY, ServerProcess, make_client, wait_until
from memkv_client import BadMacError, RemoteProtocolError, ResultKind
from memkv_client import protocol as p
from memkv_client.auth import Signer, value_digest
from memkv_client.errors import UnsupportedVersionError
from rawclient import RawSession, assert_status, frame, read_frame


def _rx_queued(port: int) -> bool:
    """True if some connection to `port` has bytes waiting in the server's receive queue."""
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


def _exchange(address: str, data: bytes) -> p.Frame | None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        return read_frame(s)


def test_request_replayed_on_the_same_connection_is_rejected(server: ServerProcess) -> None:
    with RawSession(server.port, KEY) as s:
        assert_status(s.request(p.Op.EXISTS, p.encode_keys([b"replay/k"])), p.Status.OK)
        s.sock.sendall(s.sent[-1])
        assert_status(read_frame(s.sock), p.Status.REPLAY, b"out of sequence")


def test_captured_put_with_swapped_value_is_never_stored(fresh_server: ServerProcess) -> None:
    """The issue's attack: a PUT of `balance=100` captured, its value swapped to
    `balance=999`, replayed on a new connection, to a second server holding the same
    key, and after a restart (altering bytes in flight: the next test)."""
    srv = fresh_server
    victim = RawSession(srv.port, KEY)
    captured_hello = frame(Signer(KEY), p.Op.HELLO, p.encode_hello(b"n" * 16), 5)
    reply = victim.put(b"acct/1", b"balance=100")
    assert reply is not None
    assert p.decode_flags(reply.meta, 1) == [p.Status.OK]
    swapped = victim.sent[-1].replace(b"balance=100", b"balance=999")

    def replay_elsewhere(port: int) -> p.Frame | None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(captured_hello)  # a replayed HELLO gets a fresh challenge, no AUTH
            assert read_frame(s) is not None
            s.sendall(swapped)
            return read_frame(s)

    verdict = replay_elsewhere(srv.port)
    assert verdict is not None
    assert verdict.header.status == p.Status.INVALID_REQUEST  # PUT before AUTH
    other = ServerProcess("--memory", "16MiB").start()
    try:
        verdict = replay_elsewhere(other.port)
        assert verdict is not None
        assert verdict.header.status == p.Status.INVALID_REQUEST
    finally:
        other.stop()
    victim.close()
    with make_client(srv.address) as c:
        assert c.get("acct/1") == b"balance=100"
    srv.terminate()
    srv.start()
    verdict = replay_elsewhere(srv.port)
    assert verdict is not None
    assert verdict.header.status == p.Status.INVALID_REQUEST


def test_altered_value_bytes_fail_the_item(server: ServerProcess) -> None:
    with RawSession(server.port, KEY) as s:
        meta = p.encode_put_items([(b"dig/k", 11, value_digest([b"balance=100"]))])
        reply = s.request(p.Op.PUT, meta, b"balance=999")
        assert_status(reply, p.Status.OK)
        assert reply is not None
        assert p.decode_flags(reply.meta, 1) == [p.Status.BAD_MAC]
    with make_client(server.address) as c:
        assert c.get("dig/k") is None


def test_replies_recorded_on_another_connection_are_refused(server: ServerProcess) -> None:
    """A proxy that records the server's replies on one connection and plays them back
    to the next client: the old HELLO reply does not verify, so nothing is believed."""
    from conftest import free_port

    with make_client(server.address) as c:
        c.put("fresh/k", b"v")
    recorded = bytearray()
    listener = socket.create_server(("127.0.0.1", free_port()))
    port = listener.getsockname()[1]

    def proxy() -> None:
        a, _ = listener.accept()
        with a, socket.create_connection(("127.0.0.1", server.port)) as b:
            for _ in range(3):  # HELLO, AUTH and EXISTS: forward, record the replies
                req = a.recv(65536)
                b.sendall(req)
                rep = read_frame(b)
                assert rep is not None
                data = rep.header.pack() + rep.mac + rep.meta
                recorded.extend(data)
                a.sendall(data)
        a, _ = listener.accept()
        with a, contextlib.suppress(OSError):
            a.recv(65536)
            a.sendall(bytes(recorded))  # the old HELLO reply, then the old EXISTS reply
            a.recv(65536)

    th = threading.Thread(target=proxy, daemon=True)
    th.start()
    with make_client(f"127.0.0.1:{port}", num_connections=1) as c:
        assert c.exists_on(0, ["fresh/k"]) == [True]
    with (
        make_client(f"127.0.0.1:{port}", num_connections=1) as c,
        pytest.raises(RemoteProtocolError, match="MAC"),
    ):
        c.exists_on(0, ["fresh/k"])
    th.join(10)
    listener.close()


def test_clock_drift_is_rejected(server: ServerProcess) -> None:
    old = time.time_ns() - 3600 * 10**9
    with RawSession(server.port, KEY) as s:
        reply = s.request(p.Op.EXISTS, p.encode_keys([b"k"]), ts=old)
        assert_status(reply, p.Status.CLOCK_DRIFT, b"skew")


def test_stats_with_trailing_metadata_is_refused(server: ServerProcess) -> None:
    with RawSession(server.port, KEY) as s:
        assert_status(s.request(p.Op.STATS, b"junk"), p.Status.INVALID_REQUEST)


def test_replies_are_signed_by_the_server(server: ServerProcess) -> None:
    with RawSession(server.port, KEY) as s:  # checks the HELLO reply with the nonce-bound key
        reply = s.request(p.Op.EXISTS, p.encode_keys([b"k"]))
        assert_status(reply, p.Status.OK)
        assert reply is not None
        assert s.verified(reply)
        assert not Signer(KEY).verify(reply.header.pack(), reply.meta, reply.mac)


def test_version_negotiation(server: ServerProcess) -> None:
    signer = Signer(KEY)
    nonce = b"x" * 16
    reply = _exchange(server.address, frame(signer, p.Op.HELLO, p.encode_hello(nonce, 2, 3), 1))
    assert reply is not None
    assert reply.header.status == p.Status.OK
    assert p.decode_hello_reply(reply.meta).version == 3
    reply = _exchange(server.address, frame(signer, p.Op.HELLO, p.encode_hello(nonce, 4, 5), 1))
    assert reply is not None
    assert reply.header.status == p.Status.UNSUPPORTED_VERSION
    assert b"server 3..3" in reply.meta
    v1_hello = frame(signer, p.Op.HELLO, b"\x01\x01", 1, version=1)  # a version-1 client
    reply = _exchange(server.address, v1_hello)
    assert reply is not None
    assert reply.header.status == p.Status.UNSUPPORTED_VERSION
    assert b"speaks 3..3" in reply.meta


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


def test_a_hung_member_costs_one_request_timeout_then_fails_fast(
    fresh_server: ServerProcess,
) -> None:
    """A SIGSTOPped member of two: the first batch waits one request timeout (default
    5 s) for its items, later batches fail them at once; the live member's items succeed."""
    live = ServerProcess("--memory", "64MiB").start()
    try:
        with make_client(fresh_server.address, live.address, request_timeout_ms=None) as c:
            keys = [f"hung/{i}" for i in range(32)]
            assert c.exists(keys) == [False] * 32  # connections to both are pooled
            fresh_server.freeze()
            try:
                elapsed = []
                for _ in range(3):
                    t0 = time.monotonic()
                    results = c.batch_put_views([(k, b"v", 1) for k in keys])
                    elapsed.append(time.monotonic() - t0)
                kinds = {r.kind for r in results}
                assert kinds == {ResultKind.OK, ResultKind.TRANSPORT}
            finally:
                fresh_server.thaw()
        assert elapsed[0] < 8, elapsed
        assert max(elapsed[1:]) < 1, elapsed
    finally:
        live.stop()


def test_a_version_1_server_is_named_as_such() -> None:
    """A server that answers every version-2 frame like a version-1 server would."""
    from conftest import free_port

    listener = socket.create_server(("127.0.0.1", free_port()))

    def old_server() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            msg = b"unsupported version 2"
            header = p.Header(1, 0, p.Status.UNSUPPORTED_VERSION, p.FLAG_RESPONSE, 0, 0,
                              len(msg), 0).pack()  # fmt: skip
            conn.sendall(header + Signer(KEY).sign(header, msg) + msg)

    th = threading.Thread(target=old_server, daemon=True)
    th.start()
    with (
        make_client(f"127.0.0.1:{listener.getsockname()[1]}") as c,
        pytest.raises(UnsupportedVersionError, match=r"unsupported version 2$"),
    ):
        c.exists_on(0, ["k"])
    th.join(10)
    listener.close()
