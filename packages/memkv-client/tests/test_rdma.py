"""The RDMA code path against the fake verbs backend, plus real-device tests that skip."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import KEY, KEY_HEX, ServerProcess
from fake_verbs import Fabric
from memkv_client import (
    Client,
    LocalProtocolError,
    RdmaUnavailableError,
    ResultKind,
    ServerError,
)
from memkv_client import protocol as p
from memkv_client.auth import Signer
from memkv_client.rdma import RdmaEngine
from memkv_client.server.net import MemKVServer
from memkv_client.server.rdma import RdmaResponder
from memkv_client.server.spill import SpillDir
from memkv_client.server.storage import Store
from memkv_client.verbs import open_verbs_backend

MB = 1 << 20


class InProcessServer:
    def __init__(self, fabric: Fabric, tmp: Path, memory: int = 32 * MB, lanes: int = 2) -> None:
        self.store = Store(memory, lanes, SpillDir(tmp, 64 * MB), prefault=False)
        self.responder = RdmaResponder(fabric.backend("srv0"), self.store)
        self.server = MemKVServer(self.store, "127.0.0.1", 0, Signer(KEY), rdma=self.responder)
        self.server.start()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self) -> None:
        self.server.request_stop()
        self.thread.join(30)


@pytest.fixture
def fabric() -> Fabric:
    return Fabric()


@pytest.fixture
def rdma_server(fabric: Fabric, tmp_path: Path) -> Iterator[InProcessServer]:
    srv = InProcessServer(fabric, tmp_path)
    yield srv
    srv.stop()


def rdma_client(fabric: Fabric, address: str, **overrides: object) -> Client:
    settings: dict[str, object] = {
        "servers": [address],
        "auth_key": KEY_HEX,
        "transport": "rdma",
        "num_connections": 2,
        "staging_size_mb": 8,
        "staging_slot_mb": 4,
    }
    settings.update(overrides)
    return Client(verbs_backend=fabric.backend("cli0"), **settings)


def test_round_trip_through_staging(fabric: Fabric, rdma_server: InProcessServer) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        assert c.has_rdma()
        values = [os.urandom(n) for n in (1, 5000, 70_000, 3 * MB)]
        assert all(c.batch_put_views([(f"r/{i}", v, len(v)) for i, v in enumerate(values)]))
        reads_after_put = fabric.ops["read"]
        assert reads_after_put >= 4  # the server pulled every value with RDMA READ
        outs = [bytearray(len(v)) for v in values]
        results = c.batch_get_into([(f"r/{i}", o, len(o)) for i, o in enumerate(outs)])
        assert all(results)
        assert fabric.ops["write"] >= 4  # and pushed them back with RDMA WRITE
        assert [bytes(o) for o in outs] == values
        # control operations stay on TCP
        assert c.exists(["r/0", "r/none"]) == [True, False]
        assert c.size("r/3") == 3 * MB
        assert c.get("r/1") == values[1]
        assert c.delete("r/0")
        assert c.batch_get_into([("r/0", bytearray(1), 1)])[0].kind is ResultKind.MISS
        short = bytearray(10)
        (r,) = c.batch_get_into([("r/2", short, 10)])
        assert r.kind is ResultKind.MISS
        assert "70000 bytes" in r.cause
        assert short == bytes(10)


def test_registered_region_is_used_in_place(
    fabric: Fabric, rdma_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = np.zeros((8, MB), dtype=np.uint8)
    pool[:4] = np.random.default_rng(3).integers(0, 256, (4, MB), dtype=np.uint8)
    base = pool.ctypes.data
    with rdma_client(fabric, rdma_server.address) as c:
        c.register_region(base, pool.nbytes)

        def no_staging(self: RdmaEngine, n: int) -> int | None:
            raise AssertionError("registered memory must not be staged")

        monkeypatch.setattr(RdmaEngine, "take_slot", no_staging)
        items = [(f"reg/{i}", base + i * MB, MB) for i in range(4)]
        assert all(c.batch_put_views(items))
        back = [(f"reg/{i}", base + (4 + i) * MB, MB) for i in range(4)]
        assert all(c.batch_get_into(back))
        assert np.array_equal(pool[:4], pool[4:])
        monkeypatch.undo()
        c.deregister_region(base)
        assert len(fabric.regions) == 2  # the server arena and the client staging pool


def test_large_value_posts_in_windows(
    fabric: Fabric, rdma_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memkv_client.server.rdma import RdmaPeer

    monkeypatch.setattr(RdmaPeer, "WINDOW", 3)  # 12 MiB = 48 blocks -> 16 windows
    with rdma_client(fabric, rdma_server.address, staging_size_mb=32, staging_slot_mb=16) as c:
        value = os.urandom(12 * MB)
        assert c.batch_put_views([("win/1", value, len(value))])[0].ok
        out = bytearray(len(value))
        assert c.batch_get_into([("win/1", out, len(out))])[0].ok
        assert out == value
        fabric.fail_next(1)
        (r,) = c.batch_get_into([("win/1", out, len(out))])
        assert r.kind is ResultKind.SERVER  # a failure in the first window stops the item


def test_values_larger_than_a_staging_slot_go_over_tcp(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    with rdma_client(fabric, rdma_server.address, staging_size_mb=2, staging_slot_mb=1) as c:
        value = os.urandom(3 * MB)
        before = dict(fabric.ops)
        assert c.batch_put_views([("big/1", value, len(value))])[0].ok
        out = bytearray(len(value))
        assert c.batch_get_into([("big/1", out, len(out))])[0].ok
        assert out == value
        assert fabric.ops == before


def test_failed_transfers_never_leave_partial_values(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        value = os.urandom(2 * MB)
        fabric.fail_next(1)
        (r,) = c.batch_put_views([("fail/1", value, len(value))])
        assert r.kind is ResultKind.SERVER
        assert "TRANSFER_FAILED" in r.cause
        assert c.exists(["fail/1"]) == [False]  # the half-read value was discarded
        assert c.batch_put_views([("fail/1", value, len(value))])[0].ok
        fabric.fail_next(1)
        out = bytearray(len(value))
        (r,) = c.batch_get_into([("fail/1", out, len(out))])
        assert r.kind is ResultKind.SERVER
        assert c.exists(["fail/1"]) == [True]
        assert c.batch_get_into([("fail/1", out, len(out))])[0].ok
        assert out == value


def test_spilled_and_small_values_over_rdma(fabric: Fabric, tmp_path: Path) -> None:
    srv = InProcessServer(fabric, tmp_path, memory=2 * MB, lanes=1)
    try:
        with rdma_client(fabric, srv.address) as c:
            values = [os.urandom(MB) for _ in range(4)] + [b"tiny"]
            for i, v in enumerate(values):
                assert c.batch_put_views([(f"s/{i}", v, len(v))])[0].ok
            assert srv.store.stats()["spill"]["items"] >= 2
            outs = [bytearray(len(v)) for v in values]
            assert all(c.batch_get_into([(f"s/{i}", o, len(o)) for i, o in enumerate(outs)]))
            assert [bytes(o) for o in outs] == values
    finally:
        srv.stop()


def test_concurrent_threads_over_rdma(fabric: Fabric, rdma_server: InProcessServer) -> None:
    errors: list[BaseException] = []
    with rdma_client(fabric, rdma_server.address, num_connections=3) as c:

        def worker(t: int) -> None:
            try:
                for r in range(4):
                    vals = [os.urandom(300_000 + t) for _ in range(3)]
                    keys = [f"ct/{t}/{r}/{i}" for i in range(3)]
                    assert all(
                        c.batch_put_views([(k, v, len(v)) for k, v in zip(keys, vals, strict=True)])
                    )
                    outs = [bytearray(len(v)) for v in vals]
                    assert all(
                        c.batch_get_into([(k, o, len(o)) for k, o in zip(keys, outs, strict=True)])
                    )
                    assert [bytes(o) for o in outs] == vals
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(5)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    assert not errors, errors[0]


def test_server_without_rdma(
    fabric: Fabric, server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memkv_client")
    with rdma_client(fabric, server.address, transport="auto") as c:
        assert c.has_rdma()  # this host has a (fake) device ...
        c.put("norma/a", b"v")  # ... but the server has none: TCP for it, said once
        c.put("norma/b", b"w")
        assert c.get("norma/a") == b"v"
    notes = [r.getMessage() for r in caplog.records if "has no RDMA" in r.getMessage()]
    assert len(notes) == 1
    with (
        rdma_client(fabric, server.address, transport="rdma") as c,
        pytest.raises(RdmaUnavailableError, match="no RDMA device"),
    ):
        c.exists_on(0, ["x"])


# --- real hardware (skipped wherever there is no RDMA device) ---------------------------


def _real_backend() -> object:
    backend, reason = open_verbs_backend([])
    if backend is None:
        pytest.skip(f"no RDMA device: {reason}")
    return backend


def test_real_device_loopback(tmp_path: Path) -> None:
    server_backend = _real_backend()
    client_backend = _real_backend()
    store = Store(16 * MB, 1, None, prefault=False)
    server = MemKVServer(
        store,
        "127.0.0.1",
        0,
        Signer(KEY),
        rdma=RdmaResponder(server_backend, store),  # type: ignore[arg-type]
    )
    server.start()
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        with Client(
            servers=[server.address],
            auth_key=KEY_HEX,
            transport="rdma",
            verbs_backend=client_backend,
        ) as c:
            value = os.urandom(2 * MB)
            assert c.batch_put_views([("hw/1", value, len(value))])[0].ok
            out = bytearray(len(value))
            assert c.batch_get_into([("hw/1", out, len(out))])[0].ok
            assert out == value
            pool = np.zeros((2, 2 * MB), dtype=np.uint8)
            pool[0] = np.frombuffer(value, dtype=np.uint8)
            c.register_region(pool.ctypes.data, pool.nbytes)
            base = pool.ctypes.data
            halves = [("hw/2", base, MB, 0), ("hw/2", base + MB, MB, MB)]
            assert all(c.batch_xfer(halves, is_write=True))
            assert all(c.batch_xfer([("hw/2", base + 2 * MB, 2 * MB, 0)], is_write=False))
            assert np.array_equal(pool[0], pool[1])
            c.deregister_region(base)
    finally:
        server.request_stop()
        th.join(30)


# --- real pyverbs, no device needed -------------------------------------------------------


def _pyverbs() -> None:
    from memkv_client.verbs import _import_pyverbs

    try:
        _import_pyverbs()
    except ImportError:
        pytest.skip("pyverbs (python3-pyverbs) is not installed")


def test_pyverbs_connect_attributes() -> None:
    _pyverbs()
    from memkv_client.verbs import _enum, connect_attrs

    peer = {"qpn": 77, "psn": 1234, "lid": 9, "gid": "fe80:0000:0000:0000:0000:0000:0000:0001"}
    attr = connect_attrs(
        peer, psn=42, port=1, gid_index=3, traffic_class=106, service_level=2, mtu_enum=5
    )
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn, attr.path_mtu) == (77, 1234, 42, 5)
    assert attr.ah_attr.dlid == 9
    assert attr.ah_attr.sl == 2
    assert attr.ah_attr.traffic_class == 106
    assert attr.ah_attr.dgid == peer["gid"]
    assert _enum("IBV_WR_RDMA_READ") != _enum("IBV_WR_RDMA_WRITE")
    assert _enum("IBV_ACCESS_REMOTE_READ") == 4


def test_pyverbs_without_devices_reports_a_reason() -> None:
    _pyverbs()
    backend, reason = open_verbs_backend(["mlx5_0"])
    if backend is not None:  # a machine with real RDMA: nothing to check here
        backend.close()
        pytest.skip("this machine has an RDMA device")
    assert "RDMA" in reason or "none of" in reason


# --- batch_xfer: server-driven one-sided RDMA on registered memory ------------------------


def _registered_pool(c: Client, rows: int, row: int = MB) -> np.ndarray:
    pool = np.zeros((rows, row), dtype=np.uint8)
    c.register_region(pool.ctypes.data, pool.nbytes)
    return pool


def test_xfer_round_trip_in_place(
    fabric: Fabric, rdma_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        pool = _registered_pool(c, 8)
        pool[:4] = np.random.default_rng(5).integers(0, 256, (4, MB), dtype=np.uint8)
        base = pool.ctypes.data

        def no_staging(self: RdmaEngine, n: int) -> int | None:
            raise AssertionError("batch_xfer must not stage")

        monkeypatch.setattr(RdmaEngine, "take_slot", no_staging)
        before = dict(fabric.ops)
        items = [(f"x/{i}", base + i * MB, MB, 0) for i in range(4)]
        assert all(c.batch_xfer(items, is_write=True))
        assert fabric.ops["read"] - before["read"] >= 16  # 4 values x 4 blocks, pulled
        back = [(f"x/{i}", base + (4 + i) * MB, MB, 0) for i in range(4)]
        assert all(c.batch_xfer(back, is_write=False))
        assert np.array_equal(pool[:4], pool[4:])
        monkeypatch.undo()
        assert c.size("x/2") == MB  # the same store as every other call
        out = bytearray(MB)
        assert c.batch_get_into([("x/3", out, MB)])[0].ok
        assert out == pool[3].tobytes()


def test_xfer_write_pieces_make_one_value_and_reads_take_ranges(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    with rdma_client(fabric, rdma_server.address, max_batch_size=2) as c:
        pool = _registered_pool(c, 4)
        value = np.random.default_rng(6).integers(0, 256, 700_000, dtype=np.uint8)
        cuts = [0, 100_000, 262_144 + 5, 700_000]  # the middle piece crosses a 256 KiB block
        src = pool.ctypes.data + MB
        pool[1, :700_000] = value
        pieces = [("pc/v", src + a, b - a, a) for a, b in itertools.pairwise(cuts)]
        other = ("pc/other", src + 800_000, 1000, 0)
        items = [pieces[2], other, pieces[0], pieces[1]]  # > max_batch_size: kept together
        assert [r.ok for r in c.batch_xfer(items, is_write=True)] == [True] * 4
        whole = bytearray(700_000)
        assert c.batch_get_into([("pc/v", whole, len(whole))])[0].ok
        assert whole == value.tobytes()
        dst = pool.ctypes.data + 2 * MB
        ranges = [(0, 10), (262_140, 10), (300_000, 400_000), (699_999, 1), (700_000, 0)]
        reads = [("pc/v", dst + 450_000 * i, n, off) for i, (off, n) in enumerate(ranges)]
        for (_, addr, n, off), r in zip(reads, c.batch_xfer(reads, is_write=False), strict=True):
            assert r.ok, r
            got = pool.reshape(-1)[addr - pool.ctypes.data : addr - pool.ctypes.data + n]
            assert got.tobytes() == value[off : off + n].tobytes()
        past, absent = c.batch_xfer(
            [("pc/v", dst, 10, 699_995), ("pc/none", dst, 10, 0)], is_write=False
        )
        assert past.kind is ResultKind.MISS
        assert "700000 bytes" in past.cause
        assert (absent.kind, absent.cause) == (ResultKind.MISS, "not found")


def test_xfer_small_and_spilled_values(fabric: Fabric, tmp_path: Path) -> None:
    srv = InProcessServer(fabric, tmp_path, memory=2 * MB, lanes=1)
    try:
        with rdma_client(fabric, srv.address) as c:
            pool = _registered_pool(c, 8)
            rng = np.random.default_rng(7)
            pool[:4] = rng.integers(0, 256, (4, MB), dtype=np.uint8)
            base = pool.ctypes.data
            for i in range(4):  # 4 MiB into 2 MiB of memory: the first ones spill
                assert c.batch_xfer([(f"sp/{i}", base + i * MB, MB, 0)], is_write=True)[0].ok
            tiny = [("sp/tiny", base + 3 * MB + 5, 3000, 0)]
            assert c.batch_xfer(tiny, is_write=True)[0].ok
            assert srv.store.stats()["spill"]["items"] >= 1
            out = base + 4 * MB
            reads = [(f"sp/{i}", out + i * 300_000, 200_000, 123_456) for i in range(4)]
            reads.append(("sp/tiny", out + 1_300_000, 1000, 2000))
            assert all(c.batch_xfer(reads, is_write=False))
            flat = pool.reshape(-1)
            for i in range(4):
                got = flat[4 * MB + i * 300_000 :][:200_000]
                assert np.array_equal(got, pool[i, 123_456 : 123_456 + 200_000])
            assert np.array_equal(flat[4 * MB + 1_300_000 :][:1000], pool[3, 2005:3005])
    finally:
        srv.stop()


def test_xfer_rejects_bad_items_before_sending(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        pool = _registered_pool(c, 2)
        base = pool.ctypes.data
        before = dict(fabric.ops)
        with pytest.raises(LocalProtocolError, match="gap at byte 10"):
            c.batch_xfer([("k", base, 10, 0), ("k", base, 10, 20)], is_write=True)
        with pytest.raises(LocalProtocolError, match="overlap at byte 5"):
            c.batch_xfer([("k", base, 10, 0), ("k", base, 10, 5)], is_write=True)
        with pytest.raises(LocalProtocolError, match="gap at byte 0"):
            c.batch_xfer([("k", base, 10, 4)], is_write=True)
        with pytest.raises(LocalProtocolError, match="not inside a registered region"):
            c.batch_xfer([("k", base + 2 * MB - 5, 10, 0)], is_write=False)
        with pytest.raises(LocalProtocolError, match="invalid value_offset -1"):
            c.batch_xfer([("k", base, 10, -1)], is_write=False)
        with pytest.raises(LocalProtocolError, match="invalid address"):
            c.batch_xfer([("k", bytearray(10), 10, 0)], is_write=False)  # type: ignore[list-item]
        assert fabric.ops == before
        c.batch_xfer([("k", base, 10, 4)], is_write=False)  # a range read may start anywhere


def test_xfer_server_checks_the_pieces_too(fabric: Fabric, rdma_server: InProcessServer) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        pool = _registered_pool(c, 1)
        rkey = c._rdma.find(pool.ctypes.data, 1).rkey  # type: ignore[union-attr]
        bad = [(b"k", 0, 10, pool.ctypes.data, rkey), (b"k", 15, 10, pool.ctypes.data, rkey)]
        meta = p.encode_xfer(True, bad)
        with pytest.raises(ServerError, match="do not tile"):
            c._pools[0].run(lambda s: s.tcp.call(p.Op.RDMA_XFER, meta), time.monotonic() + 30)
        assert c.exists(["k"]) == [False]


def test_xfer_failed_transfer_discards_the_whole_value(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    with rdma_client(fabric, rdma_server.address) as c:
        pool = _registered_pool(c, 4)
        pool[0] = 7
        base = pool.ctypes.data
        fabric.fail_next(1)
        halves = [("ff/1", base, MB // 2, 0), ("ff/1", base + MB // 2, MB // 2, MB // 2)]
        results = c.batch_xfer(halves, is_write=True)
        assert [r.kind for r in results] == [ResultKind.SERVER] * 2
        assert "TRANSFER_FAILED" in results[0].cause
        assert c.exists(["ff/1"]) == [False]
        assert all(c.batch_xfer(halves, is_write=True))
        fabric.fail_next(1)
        (r,) = c.batch_xfer([("ff/1", base + MB, MB, 0)], is_write=False)
        assert r.kind is ResultKind.SERVER
        assert c.batch_xfer([("ff/1", base + MB, MB, 0)], is_write=False)[0].ok
        assert (pool[1] == 7).all()


def test_xfer_without_rdma_is_a_transport_result(server: ServerProcess) -> None:
    with Client(servers=[server.address], auth_key=KEY_HEX, transport="tcp") as c:
        buf = np.zeros(MB, dtype=np.uint8)
        c.register_region(buf.ctypes.data, buf.nbytes)  # a no-op over TCP
        for is_write in (True, False):
            results = c.batch_xfer([("nr/1", buf.ctypes.data, MB, 0)] * 1, is_write)
            assert [r.kind for r in results] == [ResultKind.TRANSPORT]
            assert results[0].cause.startswith("RDMA required")
            assert "transport=tcp" in results[0].cause
        assert c.exists(["nr/1"]) == [False]  # nothing went over TCP instead
        assert c.batch_xfer([], is_write=True) == []
        with pytest.raises(LocalProtocolError, match="gap"):  # input is still checked
            c.batch_xfer([("nr/1", buf.ctypes.data, 10, 3)], is_write=True)


def test_xfer_to_a_server_without_rdma(fabric: Fabric, server: ServerProcess) -> None:
    with rdma_client(fabric, server.address, transport="auto") as c:
        pool = _registered_pool(c, 1)
        (r,) = c.batch_xfer([("nr/2", pool.ctypes.data, 100, 0)], is_write=True)
        assert r.kind is ResultKind.TRANSPORT
        assert r.cause.startswith("RDMA required")
        assert server.address in r.cause
        assert c.exists(["nr/2"]) == [False]


def test_xfer_to_a_server_that_does_not_advertise_it(
    fabric: Fabric, rdma_server: InProcessServer
) -> None:
    info = rdma_server.server.info
    rdma_server.server.info = dataclasses.replace(info, xfer=False)  # an older server
    with rdma_client(fabric, rdma_server.address) as c:
        pool = _registered_pool(c, 1)
        (r,) = c.batch_xfer([("old/1", pool.ctypes.data, 100, 0)], is_write=True)
        assert r.kind is ResultKind.SERVER
        assert r.cause.startswith("UNSUPPORTED")
        assert c.exists(["old/1"]) == [False]
