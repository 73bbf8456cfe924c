"""A real `memkv serve` process on 127.0.0.1 for tests, demos and benchmarks."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from local_ports import free_port, wait_listening


@dataclass
class MemKVServer:
    """One real `memkv serve` process; `restart` loses every value, like a crash."""

    log_path: Path
    memory: str = "256MiB"
    lanes: int = 4
    exists_lease_ms: int | None = None  # None: the server's default
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> MemKVServer:
        cmd = [sys.executable, "-m", "memkv_client.cli", "serve",
               "--listen", self.address, "--memory", self.memory, "--lanes", str(self.lanes)]  # fmt: skip
        if self.exists_lease_ms is not None:
            cmd += ["--exists-lease-ms", str(self.exists_lease_ms)]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_listening(self.port, self.proc, "memkv serve", self.log_path)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def env(self) -> dict[str, str]:
        return {"MEMKV_SERVERS": self.address, "MEMKV_TRANSPORT": "tcp"}

    def stats(self) -> dict[str, Any]:
        import memkv_client

        with memkv_client.Client(servers=[self.address], transport="tcp") as client:
            result: dict[str, Any] = client.stats(0)
            return result

    def lane_totals(self, *counters: str) -> dict[str, int]:
        """Each of `counters` (say "items", "hits", "evictions") summed over the lanes."""
        lanes = self.stats()["store"]["lanes"]
        return {name: sum(int(lane[name]) for lane in lanes) for name in counters}

    def wait_for_items(self, count: int, timeout: float = 60.0) -> None:
        """Wait until the server holds at least `count` values: an engine's stores are
        asynchronous, and its `generate` returns before the last of them has landed."""
        deadline = time.monotonic() + timeout
        while (held := self.lane_totals("items")["items"]) < count:
            if time.monotonic() > deadline:
                pytest.fail(f"MemKV holds {held} values after {timeout} s, expected {count}")
            time.sleep(0.2)


@pytest.fixture
def memkv(tmp_path: Path) -> Iterator[MemKVServer]:
    """A fresh `memkv serve` for one test (conftest.py files import this fixture)."""
    server = MemKVServer(tmp_path / "memkv.log").start()
    yield server
    server.stop()
