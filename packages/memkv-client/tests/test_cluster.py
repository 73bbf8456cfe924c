"""A three-server cluster: HRW routing, and one server down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ServerProcess, make_client
from memkv_client import ResultKind
from memkv_client.routing import Router


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[ServerProcess]]:
    servers = [ServerProcess("--memory", "16MiB").start() for _ in range(3)]
    yield servers
    for s in servers:
        s.stop()


def test_keys_spread_by_hrw(cluster: list[ServerProcess]) -> None:
    addrs = [s.address for s in cluster]
    router = Router(addrs)
    keys = [f"hrw/{i}" for i in range(90)]
    with make_client(*addrs) as c:
        assert all(c.batch_put_views([(k, k.encode(), len(k)) for k in keys]))
        for i, addr in enumerate(addrs):
            mine = [k for k in keys if router.route(k.encode()) == i]
            assert 10 < len(mine) < 50  # each server owns a fair share
            assert c.exists_on(addr, mine) == [True] * len(mine)
            others = [k for k in keys if router.route(k.encode()) != i]
            assert c.exists_on(addr, others) == [False] * len(others)
        outs = [bytearray(len(k)) for k in keys]
        assert all(c.batch_get_into([(k, o, len(o)) for k, o in zip(keys, outs, strict=True)]))
        assert [bytes(o).decode() for o in outs] == keys


def test_one_server_down(cluster: list[ServerProcess]) -> None:
    addrs = [s.address for s in cluster]
    router = Router(addrs)
    keys = [f"down/{i}" for i in range(60)]
    with make_client(*addrs) as c:
        assert all(c.batch_put_views([(k, b"v", 1) for k in keys]))
        cluster[1].kill()
        assert c.warmup() == [addrs[1]]
        on_down = [router.route(k.encode()) == 1 for k in keys]
        assert any(on_down)
        assert not all(on_down)
        assert c.exists(keys) == [not d for d in on_down]
        outs = [bytearray(1) for _ in keys]
        results = c.batch_get_into([(k, o, 1) for k, o in zip(keys, outs, strict=True)])
        for r, d in zip(results, on_down, strict=True):
            assert r.kind is (ResultKind.TRANSPORT if d else ResultKind.OK)
        results = c.batch_put_views([(k, b"w", 1) for k in keys])
        for r, d in zip(results, on_down, strict=True):
            assert r.kind is (ResultKind.TRANSPORT if d else ResultKind.OK)
            if d:
                assert addrs[1] in r.cause
