"""The chaos run's settings and processes: an engine (`chaos_engine.py`) in a session of
its own, and the check that nothing the run started is left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_report import read_calls

ENGINE = Path(__file__).resolve().parent / "chaos_engine.py"
START_LIMIT_S = 600  # engine start + calibration on a busy 2-core machine
EXIT_LIMIT_S = 120
SHARES = {"memkv": 0.4, "mooncake": 0.4, "connector": 0.2}
"""Each scenario's share of the run's `--minutes`."""


@dataclass(frozen=True)
class ChaosSettings:
    minutes: float  # under faults, all scenarios together
    seed: int  # of the workload and the fault injector

    def window_s(self, scenario: str) -> float:
        """Seconds of fault injection for `scenario` (a key of SHARES)."""
        return self.minutes * 60 * SHARES[scenario]


class EngineProcess:
    """One engine process serving `spec` in `folder` with `env`, in its own session (so a
    SIGKILL of its group leaves no child behind)."""

    def __init__(self, spec: dict[str, Any], folder: Path, env: dict[str, str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        (folder / "spec.json").write_text(json.dumps({**spec, "folder": str(folder)}))
        self.log_path = folder / "engine.log"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ENGINE), str(folder / "spec.json")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self.ready_at: float | None = None

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def calls(self) -> list[dict[str, Any]]:
        path = self.folder / "calls.jsonl"
        return read_calls(path) if path.exists() else []

    def wait_ready(self, timeout: float = START_LIMIT_S) -> float:
        """The monotonic time the engine finished its fault-free cycles and began serving."""
        deadline = time.monotonic() + timeout
        ready = self.folder / "ready"
        while not ready.exists() or not ready.read_text():
            if not self.running():
                raise RuntimeError(f"engine exited ({self.proc.returncode}) before serving:\n"
                                   f"{self.log()[-6000:]}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine not serving after {timeout} s:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        self.ready_at = float(ready.read_text())
        return self.ready_at

    def finish(self) -> int:
        """Ask the engine to stop after its current call; its exit status."""
        (self.folder / "stop").touch()
        try:
            return self.proc.wait(EXIT_LIMIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"engine did not exit {EXIT_LIMIT_S} s after stop") from None

    def kill_after_next_call(self, timeout: float = 60) -> float:
        """SIGKILL the engine's whole session the moment it finishes a call (that call's
        blocks are still being stored); the monotonic time of the kill."""
        seen = len(self.calls())
        deadline = time.monotonic() + timeout
        while len(self.calls()) == seen and time.monotonic() < deadline and self.running():
            time.sleep(0.005)
        self.kill()
        return time.monotonic()

    def kill(self) -> None:
        """SIGKILL the engine's session (every process in it) and reap the engine."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def session_members(session_ids: set[int]) -> list[int]:
    """Pids of live processes in any of these sessions (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z" and int(fields[3]) in session_ids:
            found.append(int(entry.name))
    return found


def still_running(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Pids of these processes that have not exited."""
    return [p.pid for p in procs if p.poll() is None]
