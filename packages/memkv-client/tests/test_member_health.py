"""A sick member of a real two-server cluster: stopped (SIGSTOP), killed (SIGKILL),
resumed and restarted, while a client keeps reading.

A member that misses a deadline or refuses a connection is skipped until a background
probe succeeds: the client pays one deadline per hang, not one per skip period, and
serves hits from the member within about `probe_interval_ms` once it answers again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import pytest
from conftest import ServerProcess, make_client, wait_until
from memkv_client import Client, LocalProtocolError, MemberDownError, ResultKind
from memkv_client.routing import Router

DEADLINE_S = 1.0  # the client's request_timeout_ms in these tests
RECOVERY_S = 2.0  # documented: probe_interval_ms (0.5 s) plus a round trip, with slack
VALUE = os.urandom(4096)


@pytest.fixture
def pair() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two fresh members; the first is the one the tests stop or kill."""
    sick = ServerProcess("--memory", "16MiB").start()
    well = ServerProcess("--memory", "16MiB").start()
    yield sick, well
    for srv in (sick, well):
        if srv.alive:
            srv.thaw()
            srv.kill()


def _split_keys(sick: ServerProcess, well: ServerProcess) -> tuple[list[str], list[str]]:
    router = Router([sick.address, well.address])
    keys = [f"health/{i}" for i in range(48)]
    on_sick = [k for k in keys if router.route(k.encode()) == 0]
    return on_sick, [k for k in keys if k not in on_sick]


def _read(c: Client, keys: list[str], **kw: float) -> list[ResultKind]:
    outs = [bytearray(len(VALUE)) for _ in keys]
    results = c.batch_get_into([(k, o, len(o)) for k, o in zip(keys, outs, strict=True)], **kw)
    for r, o in zip(results, outs, strict=True):
        assert not r.ok or o == VALUE
    return [r.kind for r in results]


def _transitions(caplog: pytest.LogCaptureFixture, address: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "memkv_client" and f"member {address} is" in r.getMessage()
    ]


def _read_for(c: Client, keys: list[str], seconds: float) -> list[float]:
    """Read every key (exists, then get) for `seconds`; the duration of each call."""
    durations = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        t0 = time.monotonic()
        c.exists(keys)
        durations.append(time.monotonic() - t0)
        t0 = time.monotonic()
        _read(c, keys)
        durations.append(time.monotonic() - t0)
        time.sleep(0.05)
    return durations


def _hits_again(c: Client, on_sick: list[str]) -> float:
    """Seconds until every key on the sick member is a hit again (bounded wait)."""
    t0 = time.monotonic()
    assert wait_until(lambda: all(c.exists(on_sick)), attempts=100, delay=0.05)
    assert _read(c, on_sick) == [ResultKind.OK] * len(on_sick)
    return time.monotonic() - t0


def test_a_stopped_member_costs_one_deadline_then_serves_hits_after_sigcont(
    pair: tuple[ServerProcess, ServerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    sick, well = pair
    caplog.set_level(logging.INFO, logger="memkv_client")
    on_sick, on_well = _split_keys(sick, well)
    assert on_sick
    assert on_well
    with make_client(sick.address, well.address, request_timeout_ms=int(DEADLINE_S * 1000)) as c:
        assert all(c.batch_put_views([(k, VALUE, len(VALUE)) for k in on_sick + on_well]))
        sick.freeze()
        try:
            durations = _read_for(c, on_sick + on_well, 10.0)
            kinds = _read(c, on_sick + on_well)
            assert c.exists(on_well) == [True] * len(on_well)  # the other member serves
        finally:
            sick.thaw()
        slow = [d for d in durations if d > DEADLINE_S / 2]
        assert len(slow) <= 1, f"{len(slow)} calls waited on the stopped member: {slow}"
        assert sum(slow) < DEADLINE_S + 0.5
        assert kinds == [ResultKind.TRANSPORT] * len(on_sick) + [ResultKind.OK] * len(on_well)
        recovery = _hits_again(c, on_sick)
        assert recovery < RECOVERY_S
        (health, _) = c.member_health()
        assert (health.up, health.went_down, health.came_up) == (True, 1, 1)
        assert health.deadline_misses >= 1
        assert health.skipped >= len(durations) - 2
    down, up = _transitions(caplog, sick.address)
    assert "is down" in down
    assert "timed out" in down
    assert "is up again" in up


def test_a_killed_member_is_skipped_until_it_is_back(
    pair: tuple[ServerProcess, ServerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    sick, well = pair
    caplog.set_level(logging.INFO, logger="memkv_client")
    on_sick, on_well = _split_keys(sick, well)
    with make_client(sick.address, well.address, request_timeout_ms=int(DEADLINE_S * 1000)) as c:
        assert all(c.batch_put_views([(k, VALUE, len(VALUE)) for k in on_sick + on_well]))
        sick.kill()
        _read_for(c, on_sick + on_well, 2.0)
        results = c.batch_get_into([(k, bytearray(len(VALUE)), len(VALUE)) for k in on_sick])
        assert all(r.member_down and r.member == sick.address for r in results)
        with pytest.raises(MemberDownError, match="member down"):
            c.exists_on(sick.address, on_sick)
        (health, _) = c.member_health()
        assert (health.up, health.went_down) == (False, 1)
        assert health.probes >= 2  # probed in the background all along
        sick.start()  # same port, empty
        t0 = time.monotonic()
        assert wait_until(lambda: c.member_health()[0].up, attempts=100, delay=0.05)
        assert time.monotonic() - t0 < RECOVERY_S
        assert all(c.batch_put_views([(k, VALUE, len(VALUE)) for k in on_sick]))
        assert _read(c, on_sick) == [ResultKind.OK] * len(on_sick)
    down, up = _transitions(caplog, sick.address)
    assert "is down" in down
    assert "is up again" in up


def test_a_load_that_misses_its_deadline_is_a_timeout_of_that_member(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """Told apart from "absent": the caller can log a timeout, not vanished values."""
    sick, well = pair
    on_sick, _ = _split_keys(sick, well)
    with make_client(sick.address, well.address) as c:  # request_timeout_ms: 20 s
        assert all(c.batch_put_views([(k, VALUE, len(VALUE)) for k in on_sick]))
        sick.freeze()
        t0 = time.monotonic()
        items = [(k, bytearray(len(VALUE)), len(VALUE)) for k in on_sick]
        first = c.batch_get_into(items, timeout=0.5)
        took = time.monotonic() - t0
        assert took < 0.5 + 1.0, took  # the call's budget, not the 20 s default
        assert all(r.kind is ResultKind.TRANSPORT for r in first)
        assert all(r.timed_out and r.member == sick.address for r in first)
        assert "timed out" in first[0].cause
        then = c.batch_get_into(items, timeout=0.5)
        assert all(r.member_down and not r.timed_out for r in then)
        assert c.exists(on_sick, timeout=0.5) == [False] * len(on_sick)


def test_connect_and_lookup_on_a_stopped_member_obey_the_call_timeout(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """No pooled connection yet: the connect and HELLO run under the call's budget."""
    sick, well = pair
    sick.freeze()
    with make_client(sick.address, well.address) as c:  # connect_timeout_ms: 2 s
        t0 = time.monotonic()
        assert c.warmup(timeout=0.3) == [sick.address]
        assert time.monotonic() - t0 < 0.3 + 1.0
        t0 = time.monotonic()
        assert c.exists(["a", "b", "c"], timeout=0.3) == [False] * 3
        assert time.monotonic() - t0 < 0.3 + 1.0


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_a_bad_timeout_names_the_argument(bad: object) -> None:
    with (
        Client(servers=["127.0.0.1:9"], transport="tcp") as c,
        pytest.raises(LocalProtocolError, match=r"timeout="),
    ):
        c.exists(["k"], timeout=bad)  # type: ignore[arg-type]
