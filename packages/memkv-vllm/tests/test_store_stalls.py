"""A member stopped with SIGSTOP (a hung host) costs at most one stall budget per call,
then nothing until it answers again: both backends, on real servers on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memkv_server import MemKVServer
from memkv_vllm.store import KVStore, StoreConfig, open_store
from mooncake_cluster import MooncakeCluster

BUDGET = 0.5
SLACK = 1.5  # a loaded CI host: generous, and still far below the client's own timeouts
VALUE = 64 << 10
needs_mooncake = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None,
    reason="Mooncake Store is not installed (pip install 'memkv-vllm[mooncake]')",
)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    out = call()
    return out, time.monotonic() - started


def wait_until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check()` held (the test fails after `timeout`)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "did not recover in time"
        time.sleep(0.1)
    return time.monotonic() - started


def opened(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> KVStore:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = StoreConfig.resolve({"stall_budget_s": BUDGET}, "test")
    return open_store(config, True, "test")


@pytest.fixture(params=["memkv", pytest.param("mooncake-master", marks=needs_mooncake)])
def stopped_member(
    request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[KVStore, subprocess.Popen[bytes]]]:
    if request.param == "memkv":
        server: Any = MemKVServer(tmp_path / "memkv.log").start()
        proc = server.proc
    else:
        server = MooncakeCluster(tmp_path, stores=2, segment_mb=16, client_ttl_s=10).start()
        proc = server.master
    store = opened(monkeypatch, server.env())
    yield store, proc
    os.kill(proc.pid, signal.SIGCONT)
    store.close()
    server.stop()


def test_a_stopped_member_costs_one_budget_then_nothing_and_serves_again_after_sigcont(
    stopped_member: tuple[KVStore, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    store, proc = stopped_member
    logging.getLogger("vllm.memkv_vllm").addHandler(caplog.handler)
    logging.getLogger("memkv_client").addHandler(caplog.handler)
    src, dst = np.full((2, VALUE), 7, np.uint8), np.zeros((2, VALUE), np.uint8)
    keys = [b"stall/a", b"stall/b"]
    assert all(store.batch_put([(k, src[i], VALUE) for i, k in enumerate(keys)]))
    os.kill(proc.pid, signal.SIGSTOP)
    present, first = timed(lambda: store.exists(keys))
    assert present == [False, False]  # a member that does not answer: a miss
    got, second = timed(lambda: store.batch_get_into([(keys[0], dst[0], VALUE)]))
    put, third = timed(lambda: store.batch_put([(b"stall/c", src[0], VALUE)]))
    print(f"while stopped: exists {first:.3f} s, get {second:.3f} s, put {third:.3f} s")
    assert first < BUDGET + SLACK
    assert second < BUDGET + SLACK
    assert third < BUDGET + SLACK
    assert got[0].unavailable
    assert put[0].unavailable
    assert not got[0]
    assert not put[0]
    assert not any(m.up for m in store.health())
    os.kill(proc.pid, signal.SIGCONT)
    back = wait_until(lambda: store.exists(keys) == [True, True], timeout=30)
    print(f"serving hits again {back:.2f} s after SIGCONT")
    assert all(store.batch_get_into([(keys[0], dst[0], VALUE)]))
    assert (dst[0] == 7).all()
    assert all(m.up for m in store.health())
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "is down" in line]
    assert [line for line in lines if "up again" in line]
    logging.getLogger("vllm.memkv_vllm").removeHandler(caplog.handler)
    logging.getLogger("memkv_client").removeHandler(caplog.handler)


@needs_mooncake
def test_mooncake_store_process_stopped_then_resumed_serves_puts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store process stopped past the master's client TTL is unmounted; once resumed, it
    mounts again and puts succeed (they land on the others meanwhile)."""
    cluster = MooncakeCluster(tmp_path, stores=1, segment_mb=16, client_ttl_s=2).start()
    try:
        store = opened(monkeypatch, cluster.env())
        src = np.full(VALUE, 3, np.uint8)
        assert all(store.batch_put([(b"before", src, VALUE)]))
        segment = cluster.segments[0]
        os.kill(segment.pid, signal.SIGSTOP)
        _, while_stopped = timed(lambda: store.batch_put([(b"during", src, VALUE)]))
        time.sleep(cluster.client_ttl_s + 3)  # past the TTL: the master unmounts it
        os.kill(segment.pid, signal.SIGCONT)
        counter = iter(range(1000))

        def put_works() -> bool:
            return bool(store.batch_put([(f"after/{next(counter)}".encode(), src, VALUE)])[0])

        back = wait_until(put_works, timeout=60)
        print(f"put while stopped {while_stopped:.3f} s; puts work {back:.2f} s after SIGCONT")
        assert while_stopped < BUDGET + SLACK
        store.close()
    finally:
        cluster.stop()
