"""Round trips of every client operation against a real server process."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest
from conftest import ServerProcess, make_client
from memkv_client import (
    Client,
    KeyTooLongError,
    LocalProtocolError,
    ResultKind,
    ServerError,
    ValueTooLargeError,
)


def test_put_get_size_delete(client: Client) -> None:
    assert client.get("rt/missing") is None
    assert client.size("rt/missing") is None
    client.put("rt/a", b"hello")
    client.put(b"rt/b\x00\xff", bytearray(b"binary key"))
    assert client.get("rt/a") == b"hello"
    assert client.get(b"rt/b\x00\xff") == b"binary key"
    assert client.size("rt/a") == 5
    client.put("rt/a", b"overwritten value")
    assert client.get("rt/a") == b"overwritten value"
    assert client.delete("rt/a") is True
    assert client.delete("rt/a") is False
    assert client.get("rt/a") is None


def test_empty_value_round_trips(client: Client) -> None:
    client.put("rt/empty", b"")
    assert client.size("rt/empty") == 0
    assert client.get("rt/empty") == b""


def test_exists_in_input_order(client: Client) -> None:
    client.put("ex/1", b"x")
    client.put("ex/3", b"x")
    assert client.exists(["ex/0", "ex/1", "ex/2", "ex/3", "ex/1"]) == [
        False, True, False, True, True,
    ]  # fmt: skip
    assert client.exists_on(client.servers()[0], ["ex/3", "ex/4"]) == [True, False]
    assert client.exists([]) == []


def test_batch_put_views_and_get_into_buffers(client: Client) -> None:
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 1000, 70_000, 1 << 20, 3 << 20)]
    items = [(f"bt/{i}", v, v.nbytes) for i, v in enumerate(values)]
    assert all(r.ok for r in client.batch_put_views(items))
    out = [np.zeros_like(v) for v in values]
    results = client.batch_get_into([(f"bt/{i}", o, o.nbytes) for i, o in enumerate(out)])
    assert [r.kind for r in results] == [ResultKind.OK] * len(values)
    for v, o in zip(values, out, strict=True):
        assert np.array_equal(v, o)


def test_integer_addresses(client: Client) -> None:
    src = (ctypes.c_char * 4096)()
    ctypes.memmove(src, os.urandom(4096), 4096)
    dst = (ctypes.c_char * 4096)()
    (r,) = client.batch_put_views([("addr/1", ctypes.addressof(src), 4096)])
    assert r.ok
    (r,) = client.batch_get_into([("addr/1", ctypes.addressof(dst), 4096)])
    assert r.ok
    assert bytes(dst) == bytes(src)


def test_full_length_or_miss(client: Client) -> None:
    client.put("fl/v", b"0123456789")
    short, exact, longer = bytearray(5), bytearray(10), bytearray(20)
    results = client.batch_get_into(
        [("fl/v", short, 5), ("fl/v", exact, 10), ("fl/v", longer, 20), ("fl/none", short, 5)]
    )
    assert [r.kind for r in results] == [
        ResultKind.MISS, ResultKind.OK, ResultKind.MISS, ResultKind.MISS,
    ]  # fmt: skip
    assert "10 bytes" in results[0].cause
    assert results[3].cause == "not found"
    assert exact == b"0123456789"
    assert short == bytes(5)  # a miss never writes partial data


def test_results_keep_input_order_across_chunks(server: ServerProcess) -> None:
    with make_client(server.address, max_batch_size=3, num_connections=3) as c:
        n = 40
        bufs = [bytes([i]) * (i + 1) for i in range(n)]
        assert all(c.batch_put_views([(f"ord/{i}", b, len(b)) for i, b in enumerate(bufs)]))
        # every other key missing: results must line up with the input, not with servers
        keys = [f"ord/{i}" if i % 2 == 0 else f"ord/none{i}" for i in range(n)]
        outs = [bytearray(i + 1) for i in range(n)]
        results = c.batch_get_into([(k, o, len(o)) for k, o in zip(keys, outs, strict=True)])
        for i, r in enumerate(results):
            assert r.ok == (i % 2 == 0)
            if r.ok:
                assert outs[i] == bufs[i]


def test_key_too_long_is_rejected_before_sending(client: Client) -> None:
    with pytest.raises(KeyTooLongError, match="512-byte"):
        client.put("k" * 513, b"x")
    with pytest.raises(KeyTooLongError):
        client.exists(["ok", b"x" * 600])
    client.put("k" * 512, b"x")  # exactly at the limit is fine
    assert client.get("k" * 512) == b"x"


def test_bad_arguments_raise_local_errors(client: Client) -> None:
    with pytest.raises(LocalProtocolError, match="read-only"):
        client.batch_get_into([("a", b"immutable", 9)])
    with pytest.raises(LocalProtocolError, match="fewer than length"):
        client.batch_put_views([("a", bytearray(4), 8)])
    with pytest.raises(LocalProtocolError, match="empty key"):
        client.put("", b"x")
    with pytest.raises(LocalProtocolError, match="bytes or str"):
        client.exists([42])  # type: ignore[list-item]


def test_value_too_large_is_rejected_with_clear_error(client: Client) -> None:
    big = bytearray(17 << 20)  # the 64 MiB / 4-lane server takes at most 16 MiB per value
    (r,) = client.batch_put_views([("big/v", big, len(big))])
    assert r.kind is ResultKind.SERVER
    assert "VALUE_TOO_LARGE" in r.cause
    with pytest.raises(ServerError, match="VALUE_TOO_LARGE"):
        client.put("big/v", big)
    with pytest.raises(ValueTooLargeError):
        client.batch_put_views([("big/w", 1, (1 << 30) + 1)])
    assert client.get("big/v") is None


def test_many_concurrent_clients(server: ServerProcess) -> None:
    errors: list[BaseException] = []
    shared = make_client(server.address, num_connections=4)

    def worker(t: int, c: Client) -> None:
        try:
            rng = np.random.default_rng(t)
            for round_ in range(5):
                vals = [rng.integers(0, 256, 50_000 + t, dtype=np.uint8) for _ in range(6)]
                keys = [f"cc/{t}/{round_}/{i}" for i in range(6)]
                assert all(
                    c.batch_put_views([(k, v, v.nbytes) for k, v in zip(keys, vals, strict=True)])
                )
                outs = [np.empty_like(v) for v in vals]
                assert all(
                    c.batch_get_into([(k, o, o.nbytes) for k, o in zip(keys, outs, strict=True)])
                )
                for v, o in zip(vals, outs, strict=True):
                    assert np.array_equal(v, o)
                assert c.exists(keys) == [True] * 6
        except BaseException as exc:  # reported below
            errors.append(exc)

    own = [make_client(server.address, num_connections=2) for _ in range(4)]
    threads = [threading.Thread(target=worker, args=(t, shared)) for t in range(6)]
    threads += [threading.Thread(target=worker, args=(10 + i, c)) for i, c in enumerate(own)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for c in [shared, *own]:
        c.close()
    assert not errors, errors[0]


def test_put_validates_buffers(client: Client) -> None:
    with pytest.raises(LocalProtocolError, match="not C-contiguous"):
        client.put("nc/a", np.zeros((4, 4), dtype=np.uint8)[:, 1])
    with pytest.raises(LocalProtocolError, match="pass a buffer"):
        client.put("nc/a", "text is not a buffer")  # type: ignore[arg-type]
    client.put("nc/a", np.arange(6, dtype=np.uint16).reshape(2, 3))
    assert client.get("nc/a") == np.arange(6, dtype=np.uint16).tobytes()


def test_regions_are_accepted_over_tcp(client: Client) -> None:
    buf = (ctypes.c_char * 64)()
    client.register_region(ctypes.addressof(buf), 64)  # a no-op without RDMA
    (r,) = client.batch_put_views([("rg/a", ctypes.addressof(buf), 64)])
    assert r.ok
    client.deregister_region(ctypes.addressof(buf))


def test_stats_report_lanes(client: Client) -> None:
    client.put("lane-a/x", b"1" * 100)
    st = client.stats()
    assert st["store"]["items"] >= 1
    assert len(st["store"]["lanes"]) == 4
    assert st["requests"] > 0


def test_warmup_and_servers(client: Client) -> None:
    assert client.warmup() == []
    assert len(client.servers()) == 1
    assert client.has_rdma() is False


def test_closed_client_refuses_calls(server: ServerProcess) -> None:
    c = make_client(server.address)
    c.close()
    with pytest.raises(ConnectionError):
        c.exists(["a"])
