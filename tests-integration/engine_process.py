"""A real vLLM engine in a subprocess (`drivers/generate.py`), the way a user's `vllm serve`
runs, and the prompts the suites give it. Each engine is a fresh process, so a restart is a
real new process."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tiny_model
from vllm_env import EngineRun

DRIVER = Path(__file__).resolve().parent / "drivers" / "generate.py"
BLOCK = 32
VOCAB = tiny_model.SAFE_VOCAB


def make_prompt(
    seed: int, blocks: int, tail: int = 5, prefix: list[int] | None = None
) -> list[int]:
    """Random token ids: an optional shared prefix, `blocks` full blocks, and a tail."""
    rng = random.Random(seed)
    body = [rng.randrange(10, VOCAB) for _ in range(blocks * BLOCK + tail)]
    return (prefix or []) + body


class Engine:
    """One engine process running `spec` in `folder` (its spec, log and pause files) with
    the environment `env`; it may pause between phases (`wait_paused`, `resume`)."""

    def __init__(self, spec: dict[str, Any], folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        spec = {**spec, "pause_dir": str(folder)}
        (folder / "spec.json").write_text(json.dumps(spec))
        self.log_path = folder / "engine.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(folder / "spec.json")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
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

    def wait(self, timeout: float = 600) -> int:
        """Wait for the engine to exit; its exit status (the test fails on a timeout)."""
        try:
            returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"engine timed out:\n{self.log()[-6000:]}")
        self._log.close()
        return returncode

    def result(self, timeout: float = 600) -> EngineRun:
        """Wait for the engine to finish; its results, or the test fails with its log."""
        returncode = self.wait(timeout)
        log = self.log()
        if returncode != 0:
            pytest.fail(f"engine exited with {returncode}:\n{log[-6000:]}")
        line = [x for x in log.splitlines() if x.startswith("RESULT ")][-1]
        return EngineRun(json.loads(line[len("RESULT ") :]), log)

    def kill(self) -> None:
        """SIGKILL the engine if it still runs (fixture teardown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
