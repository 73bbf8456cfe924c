"""The store interface over both backends, on real servers: `memkv serve` and a Mooncake
Store cluster (`mooncake_master` + three store processes), all on 127.0.0.1. No vLLM.

A member stopped with SIGSTOP (a hung host) costs at most one stall budget per call, then
nothing until it answers again."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kv_offload_settings import setting
from memkv_server import MemKVServer
from memkv_vllm.config import TierConfig
from memkv_vllm.doctor import doctor_checks
from memkv_vllm.errors import ConfigError
from memkv_vllm.store import BACKENDS, KVStore, StoreConfig, open_store, store_keys, store_settings
from memkv_vllm.store.registry import backend_names
from mooncake_cluster import MooncakeCluster
from vllm_kv_identity.doctor import Check
from waiting import wait_until

MiB = 1 << 20
needs_mooncake = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None,
    reason="Mooncake Store is not installed (pip install 'memkv-vllm[mooncake]')",
)


@dataclass(frozen=True)
class Local:
    """How the contract tests run a backend's members on 127.0.0.1."""

    needs: str
    """The Python package its client imports (the backend's tests skip without it)."""
    start: Callable[[Path], Any]
    """Its members, started: an object with `env()` (the settings that reach them) and
    `stop()`."""
    stalls: Callable[[Any], subprocess.Popen[bytes]]
    """The process whose stop (SIGSTOP) stalls every call."""


LOCAL = {
    "memkv": Local("memkv_client", lambda tmp: MemKVServer(tmp / "memkv.log").start(),
                   lambda server: server.proc),
    "mooncake": Local("mooncake", lambda tmp: MooncakeCluster(tmp, stores=2, segment_mb=16,
                                                              client_ttl_s=10).start(),
                      lambda cluster: cluster.master),
}  # fmt: skip
"""Every registered backend (`memkv_vllm.store.registry`): the contract tests run on each."""


def _registered() -> list[Any]:
    params = []
    for name in backend_names():
        needs = LOCAL[name].needs if name in LOCAL else ""
        missing = bool(needs) and importlib.util.find_spec(needs) is None
        params.append(pytest.param(name, marks=pytest.mark.skipif(
            missing, reason=f"{name}: {needs} is not installed")))  # fmt: skip
    return params


def test_every_registered_backend_runs_in_the_contract_tests() -> None:
    missing = sorted(set(backend_names()) - set(LOCAL))
    assert not missing, f"add how to run {missing} locally to LOCAL in {__file__}"


@pytest.fixture(params=_registered())
def members(request: Any, tmp_path: Path) -> Iterator[tuple[Any, subprocess.Popen[bytes]]]:
    """A registered backend's members, running, and the process whose stop stalls them."""
    if request.param not in LOCAL:
        pytest.fail(f"backend {request.param!r} is registered but not in LOCAL")
    local = LOCAL[request.param]
    running = local.start(tmp_path)
    proc = local.stalls(running)
    yield running, proc
    os.kill(proc.pid, signal.SIGCONT)
    running.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MooncakeCluster]:
    c = MooncakeCluster(tmp_path, stores=3, segment_mb=16).start()
    yield c
    c.stop()


def open_on(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], engine: str | None = None, **settings: Any
) -> KVStore:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    shared = {"engine": engine} if engine else {}
    return open_store(StoreConfig.resolve(settings, "test"), True, "test", **shared)


@pytest.fixture
def store(
    members: tuple[Any, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[KVStore]:
    s = open_on(monkeypatch, members[0].env())
    yield s
    s.close()


@pytest.fixture
def mooncake(cluster: MooncakeCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[KVStore]:
    s = open_on(monkeypatch, cluster.env())
    yield s
    s.close()


def filled(rows: int, size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, size), dtype=np.uint8)


def registered(store: KVStore, rows: int, size: int, seed: int) -> np.ndarray:
    """Random rows in a buffer the store has registered."""
    pool = filled(rows, size, seed)
    store.register(pool)
    return pool


def test_store_interface_answers_per_item(store: KVStore) -> None:
    src, dst = registered(store, 3, MiB, 1), registered(store, 3, MiB, 0)
    keys = [b"memkv-vllm/t/a.bin", b"memkv-vllm/t/b.bin", b"mkvd1\x00\xff\x01binary"]
    assert all(store.batch_put([(k, src[i], MiB) for i, k in enumerate(keys)]))
    assert store.exists([*keys, b"absent"]) == [True, True, True, False]
    got = store.batch_get_into([(keys[0], dst[0], MiB), (b"absent", dst[1], MiB),
                                (keys[2], dst[2], MiB)])  # fmt: skip
    assert [bool(r) for r in got] == [True, False, True]
    assert got[1].cause
    assert np.array_equal(dst[0], src[0])
    assert np.array_equal(dst[2], src[2])
    store.put_record(b"memkv-vllm/record", b"prefix")
    assert store.get_record(b"memkv-vllm/record") == b"prefix"
    assert store.get_record(b"memkv-vllm/none") is None
    # a key nobody looked up (a Mooncake lookup leases the value: it cannot be removed
    # until the lease ends)
    assert all(store.batch_put([(b"memkv-vllm/t/d.bin", src[1], MiB)]))
    deleted = store.delete([b"memkv-vllm/t/d.bin"])
    assert [bool(r) for r in deleted] == [True], deleted
    assert store.exists([b"memkv-vllm/t/d.bin"]) == [False]
    stats = store.stats()
    assert (stats["put_ok"], stats["get_ok"], stats["get_missed"]) == (4, 2, 1), stats
    assert stats["put_bytes"] == 4 * MiB


@needs_mooncake
def test_mooncake_evicts_when_full_and_reports_misses_per_item(mooncake: KVStore) -> None:
    s = mooncake
    pool = registered(s, 8, MiB, 2)
    keys = [f"evict/{i}".encode() for i in range(96)]  # 96 MiB into 3 x 16 MiB of segments
    refused = 0
    for start in range(0, len(keys), 4):
        # over the high watermark the master evicts in the background; until it has, a
        # put is refused (per item, not an exception)
        part = keys[start : start + 4]
        refused += sum(not r for r in s.batch_put([(k, pool[i], MiB) for i, k in enumerate(part)]))
        time.sleep(0.3)
    present = s.exists(keys)
    assert 0 < sum(present) <= 48, sum(present)
    assert present[-1]
    assert not present[0]
    out = registered(s, 2, MiB, 0)
    got = s.batch_get_into([(keys[0], out[0], MiB), (keys[-1], out[1], MiB)])
    assert [bool(r) for r in got] == [False, True]
    assert np.array_equal(out[1], pool[(len(keys) - 1) % 4])
    assert s.stats()["put_failed"] == refused


@needs_mooncake
def test_mooncake_lookup_leases_the_value_until_the_lease_ends(
    cluster: MooncakeCluster, mooncake: KVStore
) -> None:
    s = mooncake
    pool = registered(s, 1, MiB, 5)
    assert all(s.batch_put([(b"leased", pool[0], MiB)]))
    assert s.exists([b"leased"]) == [True]  # the lookup takes a lease (lease_ms)
    assert [r.cause for r in s.delete([b"leased"])] == ["under lease"]
    assert cluster.remove_unleased() == 0
    time.sleep(cluster.lease_ms / 1000 + 0.3)
    assert cluster.remove_unleased() == 1  # what eviction may take once the lease ended
    assert s.exists([b"leased"]) == [False]


@needs_mooncake
def test_mooncake_store_process_killed_replicas_keep_values(
    cluster: MooncakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    single = open_on(monkeypatch, cluster.env())
    double = open_on(monkeypatch, cluster.env(), mooncake_replicas=2)
    size, n = 256 << 10, 48  # 48 values per replica count: some land on every segment
    pool, out = registered(single, 4, size, 3), registered(single, 2 * n, size, 0)
    double.register(pool)
    ones = [f"r1/{i}".encode() for i in range(n)]
    twos = [f"r2/{i}".encode() for i in range(n)]
    assert all(single.batch_put([(k, pool[i % 4], size) for i, k in enumerate(ones)]))
    assert all(double.batch_put([(k, pool[i % 4], size) for i, k in enumerate(twos)]))
    cluster.kill_store(0)
    time.sleep(cluster.client_ttl_s + 3)  # the master unmounts the dead segment
    items = [(k, out[i], size) for i, k in enumerate(ones + twos)]
    got = single.batch_get_into(items)
    lost = [k for (k, _, _), r in zip(items, got, strict=True) if not r]
    assert lost, "no value sat on the killed segment"
    assert all(k.startswith(b"r1/") for k in lost), lost  # two copies: every value survived
    assert all(np.array_equal(out[n + i], pool[i % 4]) for i in range(n))
    assert single.exists(lost) == [False] * len(lost)  # lost values read as absent
    for s in (single, double):
        s.close()


@needs_mooncake
def test_mooncake_master_restart_forgets_every_value_and_recovers(
    cluster: MooncakeCluster, mooncake: KVStore
) -> None:
    s = mooncake
    pool = registered(s, 2, MiB, 4)
    assert all(s.batch_put([(b"before", pool[0], MiB)]))
    cluster.restart_master()
    assert s.exists([b"before"]) == [False]  # no HA: the new master knows no object
    deadline = time.monotonic() + 30
    while not s.batch_put([(b"after", pool[1], MiB)])[0]:  # segments re-mount themselves
        assert time.monotonic() < deadline, "no segment came back after the master restart"
        time.sleep(0.5)
    assert s.exists([b"before", b"after"]) == [False, True]


def test_store_config_chain_and_errors(tmp_path: Path) -> None:
    env = {"MEMKV_BACKEND": "mooncake", "MEMKV_MOONCAKE_MASTER": "10.0.0.5:50051",
           "MEMKV_MOONCAKE_METADATA_SERVER": "http://10.0.0.5:8080/metadata",
           "MEMKV_MOONCAKE_REPLICAS": "2"}  # fmt: skip
    cfg = StoreConfig.resolve({}, "test", env=env)
    own = cfg.backend_settings
    assert (cfg.backend, own.mooncake_replicas, own.mooncake_protocol) == ("mooncake", 2, "tcp")
    yaml_file = tmp_path / "memkv.yaml"
    yaml_file.write_text("servers: [127.0.0.1:9900]\nmooncake_replicas: 3\n")
    cfg = StoreConfig.resolve({}, "test", env={**env, "MEMKV_CONFIG": str(yaml_file)})
    assert cfg.backend_settings.mooncake_replicas == 3  # the file beats the environment
    cfg = StoreConfig.resolve({"memkv_mooncake_replicas": 1}, "extra", "memkv_",
                              env={**env, "MEMKV_CONFIG": str(yaml_file)})  # fmt: skip
    assert cfg.backend_settings.mooncake_replicas == 1  # the vLLM config beats both
    assert StoreConfig.resolve({}, "test", env={}).backend == "memkv"

    tier = "memkv-vllm: secondary_tiers[memkv]: "
    bad = [
        ({"backend": "mooncak"}, tier + f"backend must be one of {backend_names()} or a "
         "package.module:Class, got 'mooncak' (did you mean 'mooncake'?)"),
        ({"mooncake_master": "master"}, tier + "mooncake_master must be host:port of "
         "mooncake_master's RPC service (e.g. 10.0.0.5:50051), got 'master'"),
        ({"mooncake_protocol": "udp"},
         tier + "mooncake_protocol must be one of ['tcp', 'rdma'], got 'udp'"),
        ({"mooncake_metadata_server": "10.0.0.5:8080"}, tier + "mooncake_metadata_server must be "
         "http://host:port/metadata, etcd://host:port, redis://host:port or P2PHANDSHAKE, got "
         "'10.0.0.5:8080'"),
        ({"mooncake_replicas": 0}, tier + "mooncake_replicas must be an integer in [1, 16], got 0"),
        ({"mooncake_buffer_mb": "lots"},
         tier + "mooncake_buffer_mb must be an integer >= 16, got 'lots'"),
        ({"stall_budget_s": 0}, tier + "stall_budget_s must be a finite number in [0.01, 60.0], "
         "got 0"),
    ]  # fmt: skip
    for settings, message in bad:
        with pytest.raises(ConfigError) as raised:
            StoreConfig.resolve(settings, "secondary_tiers[memkv]", env=env)
        assert str(raised.value) == message
    with pytest.raises(ConfigError) as raised:
        StoreConfig.resolve({}, "test", env={**env, "MEMKV_MOONCAKE_SEGMENT_MB": "-1"})
    assert str(raised.value) == (
        "memkv-vllm: environment: MEMKV_MOONCAKE_SEGMENT_MB must be an integer >= 0, got '-1'"
    )
    with pytest.raises(ConfigError) as raised:
        StoreConfig.resolve({"memkv_backend": "mooncake"}, "kv_connector_extra_config", "memkv_",
                            env={})  # fmt: skip
    assert str(raised.value) == (
        "memkv-vllm: kv_connector_extra_config: memkv_mooncake_master is required (set it here, "
        "in MEMKV_CONFIG or as MEMKV_MOONCAKE_MASTER); accepted: host:port of mooncake_master's "
        "RPC service (e.g. 10.0.0.5:50051)"
    )


@dataclass(frozen=True)
class ExampleSettings:
    example_url: str = setting("text", "Where the example store listens.", accepts="a URL")
    example_copies: int = setting("int", "Copies of each value.", 2, minimum=1, maximum=4)


class ExampleStore:
    """A backend as a new module would declare it (never opened here)."""

    Settings = ExampleSettings

    @classmethod
    def check_config(cls, config: StoreConfig, where: str, key_prefix: str) -> None:
        if "://" not in config.backend_settings.example_url:
            raise ConfigError(where, "", f"{key_prefix}example_url must be a URL")

    @classmethod
    def doctor_checks(cls, config: StoreConfig, timeout: float) -> list[Check]:
        return [Check.ok(f"example store {config.backend_settings.example_url} answers")]


def test_a_backend_is_its_module_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """With only its registry line added, a backend's keys are read from every source,
    checked, accepted in tier entries, listed in the README table and probed by the
    doctor."""
    monkeypatch.setitem(BACKENDS, "example", f"{__name__}:ExampleStore")
    for name in [n for n in os.environ if n.startswith("MEMKV_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MEMKV_BACKEND", "example")
    monkeypatch.setenv("MEMKV_EXAMPLE_URL", "ex://10.0.0.5")
    cfg = StoreConfig.resolve({"example_copies": 3}, "secondary_tiers[memkv]")
    assert cfg.backend_settings == ExampleSettings("ex://10.0.0.5", 3)
    assert TierConfig.from_dict({"example_copies": 3})
    assert "memkv_example_url" in store_keys("memkv_")
    assert store_settings()["example_url"].env == "MEMKV_EXAMPLE_URL"
    with pytest.raises(ConfigError) as raised:
        StoreConfig.resolve({"example_copies": 5}, "secondary_tiers[memkv]")
    assert str(raised.value) == (
        "memkv-vllm: secondary_tiers[memkv]: example_copies must be an integer in [1, 4], got 5"
    )
    with pytest.raises(ConfigError, match="example_url must be a URL"):
        StoreConfig.resolve({"example_url": "10.0.0.5"}, "secondary_tiers[memkv]")
    findings = [check.finding for check in doctor_checks(None)]
    assert "example store ex://10.0.0.5 answers" in findings


@needs_mooncake
def test_mooncake_master_that_does_not_answer_fails_startup_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from local_ports import free_port

    port = free_port()
    env = {
        "MEMKV_BACKEND": "mooncake",
        "MEMKV_MOONCAKE_MASTER": f"127.0.0.1:{port}",
        "MEMKV_MOONCAKE_METADATA_SERVER": f"http://127.0.0.1:{free_port()}/metadata",
        "MEMKV_MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
        "MC_STORE_CLIENT_SETUP_RETRIES": "1",
    }  # fmt: skip (default 20 tries: ~90 s)
    with pytest.raises(RuntimeError, match=rf"mooncake_master='127.0.0.1:{port}'"):
        open_on(monkeypatch, env)


# --- a stopped member: one stall budget, then skipped until it answers -------------------

STALL_BUDGET = 0.5
SLACK = 1.5  # a loaded CI host: generous, and still far below the client's own timeouts
VALUE = 64 << 10


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    out = call()
    return out, time.monotonic() - started


@pytest.fixture
def member(
    members: tuple[Any, subprocess.Popen[bytes]],
) -> tuple[dict[str, str], subprocess.Popen[bytes]]:
    """A registered backend's settings and the process to stop (`memkv serve`, or
    Mooncake's master)."""
    running, proc = members
    return running.env(), proc


@pytest.fixture
def stopped_member(
    member: tuple[dict[str, str], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[KVStore, subprocess.Popen[bytes]]]:
    env, proc = member
    store = open_on(monkeypatch, env, stall_budget_s=STALL_BUDGET)
    yield store, proc
    os.kill(proc.pid, signal.SIGCONT)
    store.close()


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
    assert first < STALL_BUDGET + SLACK
    assert second < STALL_BUDGET + SLACK
    assert third < STALL_BUDGET + SLACK
    assert got[0].unavailable
    assert put[0].unavailable
    assert not got[0]
    assert not put[0]
    assert not store.health()[0].up  # the server, or Mooncake's master
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
        store = open_on(monkeypatch, cluster.env(), stall_budget_s=STALL_BUDGET)
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
        assert while_stopped < STALL_BUDGET + SLACK
        store.close()
    finally:
        cluster.stop()


def test_a_member_one_store_found_down_costs_the_engines_other_stores_nothing(
    member: tuple[dict[str, str], subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler's and a worker's store of one engine (here in one process; the marks
    are files, so processes share them the same way): one stop, one budget."""
    env, proc = member
    engine = f"test-{uuid.uuid4()}"
    worker, scheduler = (open_on(monkeypatch, env, engine, stall_budget_s=STALL_BUDGET)
                         for _ in range(2))  # fmt: skip
    other_engine = open_on(monkeypatch, env, "another engine", stall_budget_s=STALL_BUDGET)
    src = np.full((2, VALUE), 9, np.uint8)
    keys = [b"shared/a", b"shared/b"]
    try:
        assert all(worker.batch_put([(k, src[i], VALUE) for i, k in enumerate(keys)]))
        os.kill(proc.pid, signal.SIGSTOP)
        got, first = timed(lambda: worker.batch_get_into([(keys[0], src[1], VALUE)]))
        present, second = timed(lambda: scheduler.exists(keys))
        _, elsewhere = timed(lambda: other_engine.exists(keys))
        print(f"while stopped: the worker's get {first:.3f} s, then the scheduler's exists "
              f"{second:.3f} s (another engine's {elsewhere:.3f} s)")  # fmt: skip
        assert got[0].unavailable
        assert present == [False, False]
        assert first >= STALL_BUDGET  # the worker met the stopped member
        assert second < STALL_BUDGET / 2  # the scheduler did not wait for it again
        assert elsewhere >= STALL_BUDGET  # nothing shared beyond the engine
        assert not scheduler.health()[0].up  # the server, or Mooncake's master
        os.kill(proc.pid, signal.SIGCONT)
        back = wait_until(lambda: scheduler.exists(keys) == [True, True], timeout=30)
        print(f"the scheduler's store serves hits again {back:.2f} s after SIGCONT")
        wait_until(lambda: scheduler.health()[0].up, timeout=5)
        member = scheduler.health()[0]
        assert (member.went_down, member.came_up) == (1, 1), member
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        for s in (worker, scheduler, other_engine):
            s.close()


@needs_mooncake
def test_mooncake_master_stopped_costs_one_budget_and_registers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls that time out keep their staging range (Mooncake may still write it); later
    calls never register a new buffer (a request to the stopped master's metadata server,
    outside any deadline): they are skipped at once, puts and gets alike."""
    cluster = MooncakeCluster(tmp_path, stores=2, segment_mb=16, client_ttl_s=60).start()
    assert cluster.master is not None
    store = open_on(monkeypatch, cluster.env(), stall_budget_s=STALL_BUDGET)
    src, dst = np.full((4, VALUE), 4, np.uint8), np.zeros((4, VALUE), np.uint8)
    try:
        assert all(store.batch_put([(b"warm", src[0], VALUE)]))
        assert all(store.batch_get_into([(b"warm", dst[0], VALUE)]))
        os.kill(cluster.master.pid, signal.SIGSTOP)
        calls = []
        for i in range(3):
            new, into = [(f"new/{i}".encode(), src[i], VALUE)], [(b"warm", dst[i], VALUE)]
            put, took = timed(lambda: store.batch_put(new))  # noqa: B023 (called at once)
            got, took2 = timed(lambda: store.batch_get_into(into))  # noqa: B023
            calls += [took, took2]
            assert put[0].unavailable
            assert got[0].unavailable
        print(f"put, get, ... while the master is stopped: {[round(t, 3) for t in calls]} s")
        assert max(calls) < STALL_BUDGET + SLACK
        assert len([t for t in calls if t > STALL_BUDGET / 2]) == 1  # one budget in all
        os.kill(cluster.master.pid, signal.SIGCONT)
        wait_until(lambda: bool(store.batch_put([(b"after", src[3], VALUE)])[0]), timeout=30)
        assert all(store.batch_get_into([(b"after", dst[3], VALUE)]))
        assert (dst[3] == 4).all()
    finally:
        os.kill(cluster.master.pid, signal.SIGCONT)
        store.close()
        cluster.stop()


@needs_mooncake
def test_mooncake_stopped_store_process_costs_one_budget_then_only_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped store process (not the master), like a stopped memkv member: the first
    get to meet it waits one budget, then only its keys read as unavailable while the
    others are served, and puts go to the store processes that answer."""
    cluster = MooncakeCluster(tmp_path, stores=3, segment_mb=16, client_ttl_s=60).start()
    store = open_on(monkeypatch, cluster.env(), stall_budget_s=STALL_BUDGET)
    n = 24
    src, dst = np.full((n, VALUE), 6, np.uint8), np.zeros((n, VALUE), np.uint8)
    keys = [f"spread/{i}".encode() for i in range(n)]
    segment = cluster.segments[0]
    try:
        assert all(store.batch_put([(k, src[i], VALUE) for i, k in enumerate(keys)]))
        items = [(k, dst[i], VALUE) for i, k in enumerate(keys)]
        assert all(store.batch_get_into(items))
        os.kill(segment.pid, signal.SIGSTOP)
        rounds = [timed(lambda: store.batch_get_into(items)) for _ in range(4)]
        puts = [timed(lambda: store.batch_put([(f"during/{i}".encode(), src[i], VALUE)
                                                for i in range(8)])) for _ in range(3)]  # fmt: skip
        print(f"gets while one store process is stopped: "
              f"{[(sum(map(bool, got)), round(t, 3)) for got, t in rounds]} (served, s); puts "
              f"{[(sum(map(bool, put)), round(t, 3)) for put, t in puts]}")  # fmt: skip
        stalled = [i for i, r in enumerate(rounds[0][0]) if not r]
        assert stalled, "no value sat on the stopped store process"
        assert len(stalled) < n  # the others' keys were served
        for got, _ in rounds:
            assert [i for i, r in enumerate(got) if not r] == stalled
            assert all(got[i].unavailable for i in stalled)
        assert rounds[0][1] < STALL_BUDGET + SLACK
        assert all(took < STALL_BUDGET / 2 for _, took in rounds[1:] + puts)
        assert all(all(put) for put, _ in puts)  # placed on the store processes that answer
        assert [m.address for m in store.health() if not m.up] != []
        os.kill(segment.pid, signal.SIGCONT)
        back = wait_until(lambda: all(store.batch_get_into(items)), timeout=30)
        print(f"every key served again {back:.2f} s after SIGCONT")
        assert (dst == 6).all()
    finally:
        os.kill(segment.pid, signal.SIGCONT)
        store.close()
        cluster.stop()
