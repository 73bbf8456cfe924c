"""Member health: a member that missed a deadline or refused a connection is down
until a background probe succeeds.

While a member is down, every request to it fails at once with `MemberDownError`
(its keys read as misses) and only the probe thread talks to it, so a hung member
costs each client at most one deadline, however long it hangs. The first successful
probe brings it back for every caller. Each transition logs one WARNING line naming
the member; `MemberState.snapshot` gives the gauge and the counters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import MemberDownError

__all__ = ["ExponentialBackoff", "MemberHealth", "MemberState"]

log = logging.getLogger("memkv_client")


@dataclass(frozen=True)
class ExponentialBackoff:
    """`min(cap, base * 2**(failures-1))` seconds."""

    base: float = 0.05
    cap: float = 1.0

    def compute(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.cap, self.base * (2 ** min(failures - 1, 30))))


@dataclass(frozen=True)
class MemberHealth:
    """One member's state and counters (since the client was built)."""

    address: str
    up: bool
    """False while the member is skipped (after a missed deadline or a refused connect)."""
    down_for_s: float
    """Seconds since it went down; 0.0 while up."""
    reason: str
    """Why it last went down ("" if it never did)."""
    went_down: int
    came_up: int
    deadline_misses: int
    """Requests to it that ran out of their deadline on its socket (or its connect)."""
    skipped: int
    """Requests answered at once, without contacting it, because it was down."""
    probes: int
    probe_failures: int


class MemberState:
    """Up/down state of one member, and the thread that probes it while down. Thread-safe.

    `probe()` must contact the member within its own bound and raise on failure; it
    runs only on the probe thread, after waits of `backoff.compute(n)` seconds (n
    probes so far in this outage), so a member back within moments is probed again
    quickly and a long outage costs one probe per `backoff.cap`.
    """

    def __init__(
        self,
        address: str,
        probe: Callable[[], None],
        backoff: ExponentialBackoff,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self._probe = probe
        self._backoff = backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._down_since: float | None = None
        self._reason = ""
        self._went_down = self._came_up = self._deadline_misses = self._skipped = 0
        self._probes = self._probe_failures = 0

    @property
    def up(self) -> bool:
        return self._down_since is None

    def check(self) -> None:
        """Raise `MemberDownError` (and count the skip) if the member is down."""
        with self._lock:
            since = self._down_since
            if since is None:
                return
            self._skipped += 1
            reason = self._reason
        raise MemberDownError(
            self.address,
            f"{self.address}: member down for {self._clock() - since:.1f}s ({reason}); "
            "skipped until a background probe succeeds",
        )

    def failed(self, reason: str, *, missed_deadline: bool) -> None:
        """The member missed a deadline or refused a connection: mark it down (once)."""
        with self._lock:
            self._deadline_misses += missed_deadline
            if self._down_since is not None or self._closed.is_set():
                return
            self._down_since = self._clock()
            self._reason = reason
            self._went_down += 1
        log.warning(
            "memkv: member %s is down (%s); its keys read as misses until a background "
            "probe succeeds",
            self.address,
            reason,
        )
        name = f"memkv-probe-{self.address}"
        threading.Thread(target=self._probe_until_up, name=name, daemon=True).start()

    def _probe_until_up(self) -> None:
        attempt = 0
        while not self._closed.wait(self._backoff.compute(attempt + 1)):
            attempt += 1
            try:
                self._probe()
            except Exception as exc:  # any failure: still down, probe again later
                with self._lock:
                    self._probes += 1
                    self._probe_failures += 1
                log.debug("memkv: probe of %s failed: %s", self.address, exc)
                continue
            with self._lock:
                self._probes += 1
                since, self._down_since = self._down_since, None
                self._came_up += 1
            assert since is not None
            log.warning(
                "memkv: member %s is up again after %.1f s down",
                self.address,
                self._clock() - since,
            )
            return

    def snapshot(self) -> MemberHealth:
        with self._lock:
            since = self._down_since
            return MemberHealth(
                self.address,
                since is None,
                0.0 if since is None else self._clock() - since,
                self._reason,
                self._went_down,
                self._came_up,
                self._deadline_misses,
                self._skipped,
                self._probes,
                self._probe_failures,
            )

    def close(self) -> None:
        """Stop probing (a probe in flight ends within its own bound)."""
        self._closed.set()
