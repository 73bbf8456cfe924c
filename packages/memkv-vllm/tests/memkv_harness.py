"""Test harness (imported by conftest.py and the tests): a real ``memkv serve`` process on 127.0.0.1, a tiny local model, and real
vLLM engines (CPU build) in subprocesses, the way a user's ``vllm serve`` would run.

Engines get ``PYTHONHASHSEED=0`` (instances share blocks only with a pinned seed), the
AMX sitecustomize of tests-integration/, and tests/scaffold/ (the CPU copy worker for
vLLM's primary CPU tier) on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SCAFFOLD = HERE / "scaffold"
sys.path.insert(0, str(ROOT / "tools"))

import tiny_model  # noqa: E402  (the shared builder in tools/)
from vllm_env import EngineRun, offline_engine_env  # noqa: E402

__all__ = ["tiny_model"]  # re-exported for conftest.py


BLOCK = 32
VOCAB = 250  # below the tiny tokenizer's vocabulary size


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MemKVServer:
    """One real ``memkv serve`` process; ``restart`` loses every value, like a crash."""

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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"memkv serve exited; see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"memkv serve not listening; see {self.log_path}")

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


def engine_env(**extra: str) -> dict[str, str]:
    return offline_engine_env(SCAFFOLD, **extra)


class Engine:
    """One engine subprocess (``drivers/run_engine.py``), possibly paused between phases."""

    def __init__(self, spec: dict[str, Any], folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        spec = {**spec, "pause_dir": str(folder)}
        (folder / "spec.json").write_text(json.dumps(spec))
        self.log_path = folder / "engine.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "drivers" / "run_engine.py"), str(folder / "spec.json")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=engine_env(**env),
        )

    def wait_paused(self, phase: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not (self.folder / f"paused-{phase}").exists():
            if self.proc.poll() is not None:
                pytest.fail(f"engine exited before phase {phase}:\n{self.log()[-6000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"engine did not reach phase {phase}")
            time.sleep(0.2)

    def resume(self, phase: int) -> None:
        (self.folder / f"resume-{phase}").touch()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def result(self, timeout: float = 600) -> EngineRun:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"engine timed out:\n{self.log()[-6000:]}")
        self._log.close()
        log = self.log()
        if self.proc.returncode != 0:
            pytest.fail(f"engine exited with {self.proc.returncode}:\n{log[-6000:]}")
        line = [x for x in log.splitlines() if x.startswith("RESULT ")][-1]
        return EngineRun(json.loads(line[len("RESULT ") :]), log)


def make_prompt(
    seed: int, blocks: int, tail: int = 5, prefix: list[int] | None = None
) -> list[int]:
    rng = random.Random(seed)
    body = [rng.randrange(10, VOCAB) for _ in range(blocks * BLOCK + tail)]
    return (prefix or []) + body


P1 = make_prompt(1, 6)
P2 = make_prompt(2, 2, prefix=P1[: 4 * BLOCK])  # shares 4 blocks with P1
P3 = make_prompt(3, 5)
PROMPTS = [P1, P2, P3]


def tier_config(**tier: Any) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "CPUTestTieringSpec",  # TieringOffloadingSpec + CPU copy worker
            "spec_module_path": "cpu_tiering_spec",
            "cpu_bytes_to_use": 8 << 20,
            "block_size": BLOCK,
            "secondary_tiers": [
                {"type": "memkv", "n_read_threads": 2, "n_write_threads": 2, **tier}
            ],
        },
    }


def direct_config(plain_connector: bool = False, **extra: Any) -> dict[str, Any]:
    """The direct spec under MemKVOffloadingConnector (failed loads recompute), or under
    vLLM's plain OffloadingConnector (a failed load stops the engine)."""
    connector: dict[str, Any] = (
        {"kv_connector": "OffloadingConnector"}
        if plain_connector
        else {
            "kv_connector": "MemKVOffloadingConnector",
            "kv_connector_module_path": "memkv_vllm.connector",
            "kv_load_failure_policy": "recompute",
        }
    )
    return {
        **connector,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "MemKVOffloadingSpec",
            "spec_module_path": "memkv_vllm.spec",
            "memkv_num_threads": 2,
            **extra,
        },
    }
