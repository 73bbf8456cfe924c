"""Fixtures: real `memkv serve` processes on 127.0.0.1, and clients talking to them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from memkv_client import Client

KEY_HEX = "11" * 32
KEY = bytes.fromhex(KEY_HEX)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A `python -m memkv_client.server` child process; always on 127.0.0.1."""

    def __init__(
        self, *args: str, port: int = 0, key_hex: str = KEY_HEX, prefault: bool = False
    ) -> None:
        self.args = list(args)
        self.prefault = prefault
        self.port = port or free_port()
        self.key_hex = key_hex
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMKV_")}
        env["MEMKV_AUTH_KEY"] = self.key_hex
        cmd = [sys.executable, "-m", "memkv_client.server", "--listen", self.address]
        cmd += [*([] if self.prefault else ["--no-prefault"]), *self.args]
        # Output goes to a file, not a pipe: a chatty server must never block on a full pipe.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="memkv-", suffix=".log")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(600):  # up to 30 s for the "listening" line
            text = Path(self.log.name).read_text()
            if "listening on" in text:
                self.output.append(text)
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait(10)
        raise RuntimeError(f"server failed to start: {Path(self.log.name).read_text()}")

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.output.append(Path(self.log.name).read_text())
        return rc

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP, and wait until every thread of the server has actually stopped."""
        assert self.proc is not None
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)

        def stopped() -> bool:
            for task in Path(f"/proc/{pid}/task").iterdir():
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("T", "t"):
                    return False
            return True

        assert wait_until(stopped, attempts=400, delay=0.01), "server did not stop"

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive:
            self.terminate()


def make_client(*servers: str, **overrides: object) -> Client:
    settings: dict[str, object] = {
        "servers": list(servers),
        "auth_key": KEY_HEX,
        "transport": "tcp",
        "num_connections": 4,
        "connect_timeout_ms": 2000,
        "request_timeout_ms": 20000,
    }
    settings.update(overrides)
    return Client(**settings)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("MEMKV_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("MEMKV_AUTH_KEY_FILE", str(tmp_path / "auth.key"))  # not the user's


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One server shared by a test module (64 MiB, 4 lanes → 16 MiB max value)."""
    srv = ServerProcess("--memory", "64MiB").start()
    yield srv
    srv.stop()


@pytest.fixture
def fresh_server() -> Iterator[ServerProcess]:
    srv = ServerProcess("--memory", "64MiB").start()
    yield srv
    if srv.alive:
        srv.kill()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    c = make_client(server.address)
    yield c
    c.close()


def wait_until(predicate: object, attempts: int = 100, delay: float = 0.05) -> bool:
    """Poll `predicate()` a bounded number of times."""
    for _ in range(attempts):
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(delay)
    return False
