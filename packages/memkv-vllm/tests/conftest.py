"""Fixtures for the real-vLLM suites; the helpers live in memkv_harness.py (a unique module
name, because tests-integration/ also has a conftest.py in the same pytest run)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from memkv_harness import PROMPTS, Engine, EngineRun, MemKVServer, tiny_model


@pytest.fixture
def memkv(tmp_path: Path) -> Iterator[MemKVServer]:
    server = MemKVServer(tmp_path / "memkv.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    cached = os.environ.get("KV_TEST_MODELS")
    folder = Path(cached) if cached else tmp_path_factory.mktemp("models")
    return str(tiny_model.build(folder / "tiny-llama", "llama"))


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def start(spec: dict[str, Any], **env: str) -> Engine:
        folder = tmp_path / f"engine{len(engines)}"
        folder.mkdir()
        engines.append(Engine(spec, folder, env))
        return engines[-1]

    yield start
    for e in engines:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()


@pytest.fixture(scope="session")
def baseline(tiny_llama: str, tmp_path_factory: pytest.TempPathFactory) -> EngineRun:
    """Tokens of the standard prompts from vLLM without any connector."""
    folder = tmp_path_factory.mktemp("baseline")
    spec = {"model": tiny_llama, "phases": [{"prompts": PROMPTS}]}
    return Engine(spec, folder, {}).result()
