"""What every test and demo shares about a real vLLM process run offline on a CPU: its
environment, and the results an engine driver reports."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SITECUSTOMIZE = Path(__file__).resolve().parents[1] / "tests-integration" / "sitecustomize"


def offline_engine_env(*extra_paths: Path, **extra: str) -> dict[str, str]:
    """os.environ plus: no hub access, no usage stats, engine in-process, a fixed hash
    seed, and the AMX-permission sitecustomize (and `extra_paths`) on PYTHONPATH."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        PYTHONHASHSEED="0",
    )
    paths = [str(SITECUSTOMIZE), *map(str, extra_paths), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


@dataclass
class EngineRun:
    """What one engine process produced: per phase, per prompt outputs; and its log."""

    phases: list[list[dict[str, Any]]]
    log: str

    def tokens(self, phase: int) -> list[list[int]]:
        return [out["tokens"] for out in self.phases[phase]]

    def cached(self, phase: int) -> list[int]:
        return [out["cached"] for out in self.phases[phase]]

    def last_line(self, marker: str) -> str:
        lines = [line for line in self.log.splitlines() if marker in line]
        assert lines, f"no log line contains {marker!r}"
        return lines[-1]
