"""Per-server connection pools: every request under its caller's deadline, and a member
that misses one (or refuses a connection) skipped until a background probe succeeds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from .errors import MemKVTimeout, TransportError
from .health import ExponentialBackoff, MemberState

__all__ = ["ServerPool", "SessionLike"]

T = TypeVar("T")


class SessionLike(Protocol):
    broken: bool
    deadline: float | None

    def close(self) -> None: ...


S = TypeVar("S", bound=SessionLike)


class ServerPool(Generic[S]):
    """Up to `size` sessions to one server, each used by one thread at a time. Thread-safe.

    `factory(timeout)` connects a new session (connect and HELLO within `timeout`
    seconds); `ping(session)` is one cheap round trip, used by the background probe.
    Every `run` has a deadline (monotonic seconds) that bounds waiting for a free
    connection, connecting, and every socket wait of the request (`session.deadline`).

    A request that times out on the member's socket, or a connect that fails or times
    out, marks the member down (`MemberState`): from then on `run` raises
    `MemberDownError` at once, and only the probe (a fresh session within
    `connect_timeout`, then `ping`, retried after waits growing to `probe_interval`)
    contacts it. The probe's session is kept for the next caller.
    """

    def __init__(
        self,
        address: str,
        factory: Callable[[float], S],
        size: int,
        *,
        ping: Callable[[S], object],
        connect_timeout: float,
        probe_interval: float,
    ) -> None:
        self.address = address
        self._factory = factory
        self._ping = ping
        self._connect_timeout = connect_timeout
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[S] = []
        self._lock = threading.Lock()
        self._closed = False
        self.health = MemberState(address, self._probe, ExponentialBackoff(0.05, probe_interval))

    def _connect(self, deadline: float) -> S:
        timeout = min(self._connect_timeout, deadline - time.monotonic())
        if timeout <= 0:
            raise MemKVTimeout(f"{self.address}: deadline passed before connecting")
        try:
            session = self._factory(timeout)
        except TransportError as exc:
            self.health.failed(str(exc), missed_deadline=isinstance(exc, MemKVTimeout))
            raise
        session.deadline = deadline
        return session

    def run(self, fn: Callable[[S], T], deadline: float) -> T:
        """Call `fn` with a session by `deadline`; retry once on a fresh session if a
        reused one was stale. Raises `MemberDownError` at once while the member is down."""
        self.health.check()
        left = deadline - time.monotonic()
        if left <= 0 or not self._slots.acquire(timeout=left):
            raise MemKVTimeout(f"{self.address}: no free connection before the deadline")
        try:
            session, reused = self._take(deadline)
            try:
                return self._call(fn, session)
            except TransportError as exc:
                if isinstance(exc, MemKVTimeout) or not reused:
                    raise  # a timeout or a fresh session's failure is not retried
                self.drop_idle()  # its siblings are likely stale too (server restarted)
                return self._call(fn, self._connect(deadline))
        finally:
            self._slots.release()

    def _call(self, fn: Callable[[S], T], session: S) -> T:
        """`fn(session)`; the session goes back to the pool on success, is closed on error."""
        try:
            result = fn(session)
        except MemKVTimeout as exc:
            self._discard(session)
            self.health.failed(str(exc), missed_deadline=True)
            self.drop_idle()  # they lead to the same hung member
            raise
        except BaseException:
            self._discard(session)
            raise
        self._give_back(session)
        return result

    def _probe(self) -> None:
        """One background probe: a fresh session and a ping, both within `connect_timeout`."""
        session = self._factory(self._connect_timeout)
        session.deadline = time.monotonic() + self._connect_timeout
        try:
            self._ping(session)
        except BaseException:
            self._discard(session)
            raise
        self._give_back(session)

    def _take(self, deadline: float) -> tuple[S, bool]:
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.address}: client is closed")
            session = self._idle.pop() if self._idle else None
        if session is None:
            return self._connect(deadline), False
        session.deadline = deadline
        return session, True

    def _give_back(self, session: S) -> None:
        if session.broken:
            session.close()
            return
        with self._lock:
            if self._closed:
                session.close()
            else:
                self._idle.append(session)

    def _discard(self, session: S) -> None:
        session.broken = True
        session.close()

    def drop_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.health.close()
        self.drop_idle()
