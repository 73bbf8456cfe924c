"""`MemberGuard` on real threads: a member comes back when its probe answers, even while a
call abandoned during the stop still hangs; a call queued behind hung calls never runs late."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from memkv_vllm.store.guard import MemberGuard, MemberUnavailableError

INTERVAL_S = 0.05
BUDGET_S = 0.2
DEADLINE_S = 0.1


class Member:
    """A member that can be stopped (its calls and probes block) and resumed; `hang` is a
    call that keeps blocking after the member resumes, until `let_go`, as a backend's
    call waits for its own internal timeout."""

    def __init__(self) -> None:
        self.resumed = threading.Event()
        self.resumed.set()
        self.released = threading.Event()
        self._let_go = threading.Event()

    def probe(self) -> None:
        self.resumed.wait()

    def hang(self) -> str:
        self.resumed.wait()
        self._let_go.wait()
        return "late"

    def let_go(self) -> None:
        self._let_go.set()


@pytest.fixture
def member() -> Iterator[Member]:
    m = Member()
    yield m
    m.resumed.set()
    m.let_go()


def _guard(member: Member, max_threads: int = 8) -> MemberGuard:
    return MemberGuard("m:1", "test member", member.probe, BUDGET_S,
                       probe_interval_s=INTERVAL_S, max_threads=max_threads)  # fmt: skip


def _wait_up(guard: MemberGuard, within_s: float) -> float:
    start = time.monotonic()
    while not guard.up and time.monotonic() - start < within_s:
        time.sleep(0.01)
    return time.monotonic() - start


def test_member_is_up_once_its_probe_answers_while_an_abandoned_call_still_hangs(
    member: Member,
) -> None:
    guard = _guard(member)
    try:
        member.resumed.clear()  # stopped
        with pytest.raises(MemberUnavailableError):
            guard.run("get", member.hang, DEADLINE_S, release=member.released.set)
        assert not guard.up
        with pytest.raises(MemberUnavailableError, match="skipped"):
            guard.run("get", lambda: "x", DEADLINE_S)
        member.resumed.set()  # resumed; the abandoned call keeps hanging
        took = _wait_up(guard, within_s=10 * (INTERVAL_S + BUDGET_S))
        assert guard.up, f"still down {took:.2f} s after the member answered again"
        assert took <= INTERVAL_S + BUDGET_S + 0.5
        assert guard.run("get", lambda: "hit", DEADLINE_S) == "hit"
        assert not member.released.is_set()  # the abandoned call still owns its staging
        member.let_go()
        assert member.released.wait(5)
    finally:
        guard.close()


def test_a_call_queued_behind_hung_calls_is_bounded_by_its_deadline_and_never_runs(
    member: Member,
) -> None:
    guard = _guard(member, max_threads=1)
    ran = threading.Event()
    queued_released = threading.Event()

    def late() -> None:
        ran.set()

    try:
        member.resumed.clear()
        hung = guard.start("get", member.hang, DEADLINE_S, release=member.released.set)
        queued = guard.start("get", late, DEADLINE_S, release=queued_released.set)
        with pytest.raises(MemberUnavailableError):
            guard.finish(hung)
        start = time.monotonic()
        with pytest.raises(MemberUnavailableError):
            guard.finish(queued)
        assert time.monotonic() - start <= DEADLINE_S + 0.5
        assert queued_released.is_set()  # its staging came back at once
        member.resumed.set()
        member.let_go()
        assert member.released.wait(5)
        assert _wait_up(guard, within_s=5) < 5
        assert not ran.is_set(), "a call whose caller gave up ran after its deadline"
    finally:
        guard.close()
