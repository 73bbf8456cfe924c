"""Loopback ports for the servers that tests, demos and benchmarks start."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago (the kernel's ephemeral choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(
    port: int, proc: subprocess.Popen[bytes], name: str, log: Path, timeout: float = 30
) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; raise if `proc` exits first
    (RuntimeError) or `timeout` seconds pass (TimeoutError), naming `name` and its `log`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited; see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{name} not listening on {port}; see {log}")
