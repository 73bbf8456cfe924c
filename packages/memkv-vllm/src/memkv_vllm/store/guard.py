"""`MemberGuard`: deadlines and down/up health for a backend whose client has neither.

Each call runs on the guard's own threads while the caller waits at most its deadline.
The backend cannot cancel a running call, so one that misses its deadline keeps its
thread (and `release` waits) until it returns ("abandoned"); one still queued for a thread
is cancelled and never runs. The member is then down: every call fails at once with
`MemberUnavailableError` (no network), until a fresh probe, tried on a background thread
every `probe_interval_s`, answers within the stall budget, whether or not abandoned calls
still hang (a backend's own timeouts may hold them long after the member is back).
Threads are capped (`max_threads`, abandoned calls included): a call that finds none free
waits in the queue, within its own deadline.
A member another store of the engine found down (`.health_board`) is skipped the same way.
Each transition is logged once, with the member's address. No vLLM import.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Generic, TypeVar

from .health_board import HealthBoard
from .protocol import MemberState

__all__ = ["Call", "MemberGuard", "MemberUnavailableError"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
T = TypeVar("T")
MAX_THREADS = 64  # default cap on calls running at once, abandoned ones included
PROBE_INTERVAL_S = 0.5  # memkv-client's probe_interval_ms default


class MemberUnavailableError(Exception):
    """The member missed this call's deadline, or is down and was skipped."""

    def __init__(self, address: str, timed_out: bool, detail: str) -> None:
        super().__init__(detail)
        self.address = address
        self.timed_out = timed_out


@dataclass(frozen=True)
class Call(Generic[T]):
    """A call started by `MemberGuard.start`, to be waited on by `MemberGuard.finish`."""

    op: str
    future: Future[T]
    deadline: float  # monotonic
    deadline_s: float
    release: Callable[[], None]


class MemberGuard:
    """One member (`address`, described as `what` in logs) behind deadlines.

    `probe` is a cheap call that raises unless the member answers; it runs under
    `budget_s`. `board` shares this member's down verdicts with the engine's other
    stores. Thread-safe.
    """

    def __init__(
        self,
        address: str,
        what: str,
        probe: Callable[[], object],
        budget_s: float,
        probe_interval_s: float = PROBE_INTERVAL_S,
        board: HealthBoard | None = None,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self.address = address
        self._what = what
        self._probe = probe
        self._budget = budget_s
        self._interval = probe_interval_s
        self._board = board or HealthBoard(None)
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="memkv-guard")
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._closed = threading.Event()
        self.went_down = 0
        self.came_up = 0
        self.deadline_misses = 0
        self.skipped = 0

    @property
    def up(self) -> bool:
        """Up for this store: not found down here, nor by another store of the engine."""
        return self._up_here() and not self._board.skip(self.address)

    def _up_here(self) -> bool:
        with self._lock:
            return self._down_since is None

    def state(self) -> MemberState:
        board = self._board
        return MemberState(self.address, self.up,
                           self.went_down + board.went_down.get(self.address, 0),
                           self.came_up + board.came_up.get(self.address, 0))  # fmt: skip

    def run(
        self,
        op: str,
        call: Callable[[], T],
        deadline_s: float,
        release: Callable[[], None] = lambda: None,
    ) -> T:
        """`call()`'s result if it returns within `deadline_s`; else `MemberUnavailableError`.

        `release` frees what the call owns (e.g. its staging buffer) once the call is
        over: at once when the call never starts (the member is down, or the call was
        still queued at its deadline), when an abandoned call finally returns; a call
        that returned in time leaves it to the caller.
        """
        return self.finish(self.start(op, call, deadline_s, release))

    def start(
        self,
        op: str,
        call: Callable[[], T],
        deadline_s: float,
        release: Callable[[], None] = lambda: None,
    ) -> Call[T]:
        """`run`'s first half: start `call` now (raising at once while the member is
        down); `finish` waits for it. Calls started together run in parallel."""
        if not self.up:
            with self._lock:
                self.skipped += 1
            release()
            raise MemberUnavailableError(self.address, False, f"{self._what} is down (skipped)")
        deadline = time.monotonic() + deadline_s
        return Call(op, self._pool.submit(call), deadline, deadline_s, release)

    def finish(self, call: Call[T]) -> T:
        """`run`'s second half: the started call's result by its deadline."""
        try:
            return call.future.result(timeout=max(0.0, call.deadline - time.monotonic()))
        except FutureTimeout:
            pass
        with self._lock:
            self.deadline_misses += 1
        call.future.cancel()  # still queued for a thread: it never runs
        call.future.add_done_callback(lambda _: call.release())
        self._mark_down(f"{call.op} missed its {call.deadline_s:.2f} s deadline")
        raise MemberUnavailableError(self.address, True,
                                     f"{call.op} timed out after {call.deadline_s:.2f} s "
                                     f"({self._what})")  # fmt: skip

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
            self.went_down += 1
        log.warning(
            "memkv-vllm: %s %s is down (%s); its keys read as misses and stores are dropped "
            "until a background probe answers", self._what, self.address, reason,
        )  # fmt: skip
        self._board.found_down(self.address, lambda: not self._up_here())
        threading.Thread(target=self._probe_until_up, name="memkv-guard-probe", daemon=True).start()

    def _probe_until_up(self) -> None:
        probe: Future[object] | None = None
        while not self._closed.wait(self._interval):
            if probe is not None and not probe.done():
                continue  # the last probe still hangs (or waits for a thread): no second one
            probe = self._pool.submit(self._probe)
            try:
                probe.result(timeout=self._budget)
            except Exception:  # it failed, or missed the budget (FutureTimeout)
                continue
            with self._lock:
                since = self._down_since or time.monotonic()
                self._down_since = None
                self.came_up += 1
            log.warning("memkv-vllm: %s %s is up again after %.1f s down", self._what,
                        self.address, time.monotonic() - since)  # fmt: skip
            return

    def close(self) -> None:
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
