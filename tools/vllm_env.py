"""The environment every test and demo gives a real vLLM process running offline on a CPU."""

from __future__ import annotations

import os
from pathlib import Path

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
