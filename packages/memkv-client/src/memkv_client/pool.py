"""Per-server connection pools with reconnect backoff."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .errors import MemKVTimeout, TransportError

__all__ = ["ExponentialBackoff", "ServerPool", "SessionLike"]

T = TypeVar("T")


class SessionLike(Protocol):
    broken: bool

    def close(self) -> None: ...


S = TypeVar("S", bound=SessionLike)


@dataclass(frozen=True)
class ExponentialBackoff:
    """`min(cap, base * 2**(failures-1))` seconds."""

    base: float = 0.05
    cap: float = 1.0

    def compute(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.cap, self.base * (2 ** min(failures - 1, 30))))


class ServerPool(Generic[S]):
    """Up to `size` sessions to one server, each used by one thread at a time. Thread-safe.

    After a failed connect, new connects fail fast until the backoff has passed, so a
    dead server costs one connect attempt per backoff period rather than one per call.
    After a request times out, connects fail fast for `wait_timeout` seconds, so a hung
    (e.g. SIGSTOPped) server costs a batch at most one request timeout.
    """

    def __init__(
        self,
        address: str,
        factory: Callable[[], S],
        size: int,
        wait_timeout: float,
        backoff: ExponentialBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self._factory = factory
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[S] = []
        self._lock = threading.Lock()
        self._wait = wait_timeout
        self._backoff = backoff or ExponentialBackoff()
        self._clock = clock
        self._failures = 0
        self._down_until = 0.0
        self._last_error = ""
        self._closed = False

    def _hung(self, exc: MemKVTimeout) -> None:
        """A request timed out: the server is hung or overloaded. Fail fast for one
        request timeout (`wait_timeout`) instead of making every caller wait it out,
        and drop the idle sessions, which lead to the same server."""
        with self._lock:
            self._down_until = max(self._down_until, self._clock() + self._wait)
            self._last_error = str(exc)
        self.drop_idle()

    def _connect(self) -> S:
        with self._lock:
            now = self._clock()
            if now < self._down_until:
                raise TransportError(
                    f"{self.address}: server unreachable ({self._last_error}); "
                    f"next attempt in {self._down_until - now:.2f}s"
                )
        try:
            session = self._factory()
        except TransportError as exc:
            with self._lock:
                self._failures += 1
                self._down_until = self._clock() + self._backoff.compute(self._failures)
                self._last_error = str(exc)
            raise
        with self._lock:
            self._failures = 0
            self._down_until = 0.0
        return session

    def run(self, fn: Callable[[S], T]) -> T:
        """Call `fn` with a session; retry once on a fresh session if a reused one was stale."""
        if not self._slots.acquire(timeout=self._wait):
            raise MemKVTimeout(f"{self.address}: no free connection within {self._wait:g}s")
        try:
            session, reused = self._take()
            try:
                result = fn(session)
            except TransportError as exc:
                self._discard(session)
                if isinstance(exc, MemKVTimeout):
                    self._hung(exc)
                    raise
                if not reused:
                    raise  # a stale pooled connection fails fast
                self.drop_idle()  # its siblings are likely stale too (server restarted)
                session = self._connect()
                try:
                    result = fn(session)
                except BaseException:
                    self._discard(session)
                    raise
            except BaseException:
                self._discard(session)
                raise
            self._give_back(session)
            return result
        finally:
            self._slots.release()

    def _take(self) -> tuple[S, bool]:
        with self._lock:
            if self._closed:
                raise TransportError(f"{self.address}: client is closed")
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

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
        self.drop_idle()
