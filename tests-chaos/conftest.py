"""The chaos run (`nox -s chaos`; `nox -s chaos -- --minutes 30` for a long one): its
options, the tiny model, the reference workload, and the summary printed at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path += [str(ROOT / "tools"), str(ROOT / "tests-integration")]

import tiny_model  # noqa: E402
from chaos_report import Outcome  # noqa: E402
from chaos_run import (  # noqa: E402
    SHARES,
    START_LIMIT_S,
    ChaosSettings,
    EngineProcess,
)
from chaos_workload import Workload  # noqa: E402
from memkv_harness import KV_CACHE_MEMORY_BYTES, engine_env  # noqa: E402

DEFAULT_MINUTES = 1.25
SESSIONS, TURNS = 8, 3
OUTCOMES = pytest.StashKey[list[Outcome]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos")
    group.addoption("--minutes", type=float, default=DEFAULT_MINUTES,
                    help="minutes the engines serve under faults, split over the scenarios "
                         f"{SHARES} (default {DEFAULT_MINUTES}; engine start-ups come "
                         "on top)")  # fmt: skip
    group.addoption("--chaos-seed", type=int, default=41,
                    help="seed of the workload and of the fault injector (default 41)")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    minutes = config.getoption("--minutes")
    if not minutes > 0:
        raise pytest.UsageError(f"--minutes must be a number of minutes > 0, got {minutes}")
    config.stash[OUTCOMES] = []


@pytest.fixture(scope="session")
def settings(pytestconfig: pytest.Config) -> ChaosSettings:
    return ChaosSettings(pytestconfig.getoption("--minutes"),
                         pytestconfig.getoption("--chaos-seed"))  # fmt: skip


@pytest.fixture(scope="session")
def outcomes(pytestconfig: pytest.Config) -> list[Outcome]:
    """Scenarios append their outcome here; the summary prints them."""
    return pytestconfig.stash[OUTCOMES]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    cached = os.environ.get("KV_TEST_MODELS")
    models = Path(cached) if cached else tmp_path_factory.mktemp("models")
    return str(tiny_model.build(models / "tiny-llama", "llama"))


@pytest.fixture(scope="session")
def workload(
    tiny_llama: str, settings: ChaosSettings, tmp_path_factory: pytest.TempPathFactory
) -> Workload:
    """The seeded workload and its reference replies, from an engine without offload."""
    folder = tmp_path_factory.mktemp("reference")
    path = folder / "workload.json"
    spec = {"model": tiny_llama, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES,
            "workload": str(path),
            "build": {"seed": settings.seed, "sessions": SESSIONS, "turns": TURNS}}  # fmt: skip
    engine = EngineProcess(spec, folder, engine_env())
    try:
        code = engine.proc.wait(START_LIMIT_S)
    except subprocess.TimeoutExpired:
        engine.kill()
        pytest.fail(f"the reference engine did not finish in {START_LIMIT_S} s")
    assert code == 0, engine.log()[-6000:]
    return Workload.load(path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:  # fmt: skip
    found = config.stash.get(OUTCOMES, [])
    if not found:
        return
    terminalreporter.section("chaos run")
    minutes, seed = config.getoption("--minutes"), config.getoption("--chaos-seed")
    terminalreporter.write_line(f"nox -s chaos -- --minutes {minutes:g} --chaos-seed {seed}")
    for outcome in found:
        terminalreporter.write_line(outcome.summary())
