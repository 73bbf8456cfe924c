"""The RDMA code path against the fake verbs backend, plus real-device tests that skip."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import KEY, KEY_HEX, ServerProcess
from fake_verbs import Fabric
from memkv_client import Client, RdmaUnavailableError, ResultKind
from memkv_client.auth import Signer
from memkv_client.rdma import RdmaEngine, RdmaResponder
from memkv_client.server.net import MemKVServer
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
    from memkv_client.rdma import RdmaPeer

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
