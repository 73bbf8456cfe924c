"""Connection pool rules, with fake sessions: reuse, retry, deadlines, member health."""

from __future__ import annotations

import time

import pytest
from conftest import wait_until
from memkv_client.errors import MemberDownError, MemKVTimeout, TransportError
from memkv_client.health import ExponentialBackoff
from memkv_client.pool import ServerPool


class FakeSession:
    def __init__(self, n: int) -> None:
        self.n = n
        self.broken = False
        self.closed = False
        self.deadline: float | None = None

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeSession] = []
        self.timeouts: list[float] = []
        self.fail = False

    def __call__(self, timeout: float) -> FakeSession:
        self.timeouts.append(timeout)
        if self.fail:
            raise TransportError("connect refused")
        s = FakeSession(len(self.made))
        self.made.append(s)
        return s


def make(factory: Factory, probe_interval: float = 0.05) -> ServerPool[FakeSession]:
    return ServerPool(
        "h:1", factory, 2, ping=lambda s: None, connect_timeout=5.0, probe_interval=probe_interval
    )


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


def test_backoff_values() -> None:
    b = ExponentialBackoff(0.05, 1.0)
    assert [b.compute(n) for n in range(7)] == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_sessions_are_reused_and_carry_the_deadline() -> None:
    f = Factory()
    pool = make(f)
    deadline = soon()
    assert pool.run(lambda s: (s.n, s.deadline), deadline) == (0, deadline)
    assert pool.run(lambda s: s.n, soon()) == 0
    assert len(f.made) == 1
    assert f.timeouts == [5.0]  # the connect timeout when the deadline is further away
    pool.close()


def test_connect_is_bounded_by_the_deadline() -> None:
    f = Factory()
    pool = make(f)
    pool.run(lambda s: s.n, soon(0.5))
    assert 0 < f.timeouts[0] <= 0.5
    with pytest.raises(MemKVTimeout, match="before the deadline"):
        pool.run(lambda s: s.n, time.monotonic() - 1)
    assert pool.health.up  # a caller's spent budget is not the member's fault
    pool.close()


def test_refused_connect_marks_the_member_down_until_a_probe_succeeds() -> None:
    """Real requests never retry a down member; only the background probe does."""
    f = Factory()
    pool = make(f, probe_interval=0.05)
    f.fail = True
    with pytest.raises(TransportError, match="refused"):
        pool.run(lambda s: s.n, soon())
    assert not pool.health.up
    assert wait_until(lambda: pool.health.snapshot().probe_failures >= 2)
    made_by_probes = len(f.timeouts)
    with pytest.raises(MemberDownError, match="member down"):
        pool.run(lambda s: s.n, soon())
    assert len(f.timeouts) - made_by_probes <= 1  # at most a probe in between, no request
    f.fail = False
    assert wait_until(lambda: pool.health.up)
    assert pool.run(lambda s: s.n, soon()) == 0  # the probe's session, kept for callers
    assert len(f.made) == 1
    health = pool.health.snapshot()
    assert (health.went_down, health.came_up, health.skipped) == (1, 1, 1)
    pool.close()


def test_stale_pooled_session_is_retried_once_on_a_fresh_one() -> None:
    f = Factory()
    pool = make(f)
    pool.run(lambda s: s.n, soon())
    calls: list[int] = []

    def op(s: FakeSession) -> int:
        calls.append(s.n)
        if s.n == 0:
            raise TransportError("reset by peer")
        return s.n

    assert pool.run(op, soon()) == 1
    assert calls == [0, 1]
    assert f.made[0].closed
    assert pool.health.up
    pool.close()


def test_a_timeout_is_not_retried_and_marks_the_member_down() -> None:
    f = Factory()
    pool = make(f, probe_interval=60)
    pool.run(lambda s: s.n, soon())

    def op(s: FakeSession) -> int:
        raise MemKVTimeout("request timed out")

    with pytest.raises(MemKVTimeout):
        pool.run(op, soon())
    assert len(f.made) == 1
    health = pool.health.snapshot()
    assert (health.up, health.deadline_misses, health.reason) == (False, 1, "request timed out")
    pool.close()


def test_fresh_session_failure_is_not_retried() -> None:
    f = Factory()
    pool = make(f)

    def op(s: FakeSession) -> int:
        raise TransportError("reset")

    with pytest.raises(TransportError):
        pool.run(op, soon())
    assert len(f.made) == 1
    pool.close()


def test_all_slots_busy_times_out() -> None:
    f = Factory()
    pool = make(f)

    def nested(s: FakeSession) -> int:
        return pool.run(lambda t: pool.run(lambda u: u.n, soon(0.01)), soon())  # a third slot

    with pytest.raises(MemKVTimeout, match="no free connection"):
        pool.run(nested, soon())
    pool.close()


def test_closed_pool_refuses() -> None:
    f = Factory()
    pool = make(f)
    pool.run(lambda s: s.n, soon())
    pool.close()
    assert f.made[0].closed
    with pytest.raises(TransportError, match="closed"):
        pool.run(lambda s: s.n, soon())
