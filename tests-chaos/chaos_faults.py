"""The chaos run's seeded fault injector: one fault at a time on real processes.

A fault is `stop` (SIGSTOP, held, then SIGCONT) or `kill` (SIGKILL, held down, then the
process is started again, on the same address where it has one, holding no value: every
target here keeps its values in memory only). A stop comes back empty too when it outlasts
the target's `loses_values_after_s` (a Mooncake master unmounts a store process silent for
longer than its client TTL, and expires every store's segment after a stop of its own that
long). Faults go through every
(target, kind) pair in a shuffled order, then again in another, so a short run meets each
kind; the order, how long each is held and the gap before the next come from one
`random.Random(seed)`. Times are on the system's monotonic clock, the one the engines'
call records use.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

HOLD_S = (1.5, 3.0)  # how long a fault lasts (a stop longer than a 1 s budget)
GAP_S = (2.5, 3.5)  # quiet time after a recovery (hits must return within it)


@dataclass
class Target:
    """A process the injector may stop or kill; `restart` starts it again after a kill and
    returns once it serves."""

    name: str
    pid: Callable[[], int]
    restart: Callable[[], None]
    kinds: tuple[str, ...] = ("stop", "kill")
    loses_values_after_s: float | None = None  # a longer stop loses what it held


@dataclass(frozen=True)
class Fault:
    kind: str  # "stop", "kill", or "fill" (a filesystem filled, then freed)
    target: str
    start: float  # signal sent, or filesystem full (monotonic)
    recovered: float  # SIGCONT sent, the restarted process serves again, or space freed
    empty: bool = False  # the process came back without the values it held

    @property
    def label(self) -> str:
        return f"{self.target} {WHAT[self.kind]}"


WHAT = {"stop": "SIGSTOP/SIGCONT", "kill": "SIGKILL/restart", "fill": "filled/freed"}


class Injector:
    """Injects faults into `targets` until `inject(until)` returns; `stopped` holds pids that
    are SIGSTOPped right now (so a cleanup can resume them before stopping them)."""

    def __init__(self, seed: int, targets: list[Target]) -> None:
        self.rng = random.Random(seed)
        self.targets = targets
        self.faults: list[Fault] = []
        self.stopped: set[int] = set()

    def inject(self, until: float, alive: Callable[[], bool] = lambda: True) -> list[Fault]:
        """Faults, each followed by a gap, while a whole fault and its gap fit before `until`
        and `alive()` holds (the engine still serves)."""
        pairs = [(t, kind) for t in self.targets for kind in t.kinds]
        order: list[tuple[Target, str]] = []
        while alive():
            if not order:
                order = self.rng.sample(pairs, len(pairs))
            target, kind = order.pop()
            gap, hold = self.rng.uniform(*GAP_S), self.rng.uniform(*HOLD_S)
            if time.monotonic() + gap + hold + GAP_S[1] > until:
                break
            time.sleep(gap)
            self.faults.append(self.one(target, kind, hold))
        time.sleep(max(0.0, min(GAP_S[1], until - time.monotonic())))
        return self.faults

    def one(self, target: Target, kind: str, hold: float) -> Fault:
        pid = target.pid()
        start = time.monotonic()
        if kind == "stop":
            os.kill(pid, signal.SIGSTOP)
            self.stopped.add(pid)
            time.sleep(hold)
            os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
        else:
            os.kill(pid, signal.SIGKILL)
            time.sleep(hold)
            target.restart()
        recovered = time.monotonic()
        lost = target.loses_values_after_s
        empty = kind == "kill" or (lost is not None and recovered - start > lost)
        return Fault(kind, target.name, start, recovered, empty=empty)

    def resume_all(self) -> None:
        for pid in list(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.stopped.discard(pid)
