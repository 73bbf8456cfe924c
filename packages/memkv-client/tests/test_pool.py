"""Connection pool rules, with fake sessions and an injected clock."""

from __future__ import annotations

import pytest
from memkv_client.errors import MemKVTimeout, TransportError
from memkv_client.pool import ExponentialBackoff, ServerPool


class FakeSession:
    def __init__(self, n: int) -> None:
        self.n = n
        self.broken = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeSession] = []
        self.fail = False

    def __call__(self) -> FakeSession:
        if self.fail:
            raise TransportError("connect refused")
        s = FakeSession(len(self.made))
        self.made.append(s)
        return s


def make(factory: Factory, now: list[float]) -> ServerPool[FakeSession]:
    return ServerPool("h:1", factory, 2, 0.01, ExponentialBackoff(0.1, 1.0), clock=lambda: now[0])


def test_backoff_values() -> None:
    b = ExponentialBackoff(0.05, 1.0)
    assert [b.compute(n) for n in range(7)] == [0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_sessions_are_reused() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)
    assert pool.run(lambda s: s.n) == 0
    assert pool.run(lambda s: s.n) == 0
    assert len(f.made) == 1


def test_failed_connect_backs_off_without_retrying_the_connect() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)
    f.fail = True
    with pytest.raises(TransportError, match="refused"):
        pool.run(lambda s: s.n)
    f.fail = False
    with pytest.raises(TransportError, match=r"next attempt in 0\.10s"):
        pool.run(lambda s: s.n)  # within the backoff: fails fast, no connect
    assert f.made == []
    now[0] = 0.2
    assert pool.run(lambda s: s.n) == 0


def test_stale_pooled_session_is_retried_once_on_a_fresh_one() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)
    pool.run(lambda s: s.n)
    calls: list[int] = []

    def op(s: FakeSession) -> int:
        calls.append(s.n)
        if s.n == 0:
            raise TransportError("reset by peer")
        return s.n

    assert pool.run(op) == 1
    assert calls == [0, 1]
    assert f.made[0].closed


def test_timeouts_are_not_retried() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)
    pool.run(lambda s: s.n)

    def op(s: FakeSession) -> int:
        raise MemKVTimeout("request timed out")

    with pytest.raises(MemKVTimeout):
        pool.run(op)
    assert len(f.made) == 1


def test_fresh_session_failure_is_not_retried() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)

    def op(s: FakeSession) -> int:
        raise TransportError("reset")

    with pytest.raises(TransportError):
        pool.run(op)
    assert len(f.made) == 1


def test_all_slots_busy_times_out() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)

    def nested(s: FakeSession) -> int:
        return pool.run(lambda t: pool.run(lambda u: u.n))  # needs a third slot

    with pytest.raises(MemKVTimeout, match="no free connection"):
        pool.run(nested)


def test_closed_pool_refuses() -> None:
    f, now = Factory(), [0.0]
    pool = make(f, now)
    pool.run(lambda s: s.n)
    pool.close()
    assert f.made[0].closed
    with pytest.raises(TransportError, match="closed"):
        pool.run(lambda s: s.n)
