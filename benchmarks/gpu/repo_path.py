"""Make the repository's packages importable from their source folders (no install needed).

`worker_modules()` also lets the connector's worker-side modules load where vLLM is not
installed yet (the first kit run): it skips the package `__init__` (which imports the
vLLM connector base) and, only if vLLM is missing, supplies the two metadata base classes
the worker's messages derive from.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def add_sources() -> None:
    """Put every `packages/*/src` on sys.path and on PYTHONPATH (for vLLM's subprocesses)."""
    sources = [str(src) for src in sorted((ROOT / "packages").glob("*/src"))]
    for src in sources:
        if src not in sys.path:
            sys.path.insert(0, src)
    current = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([*sources, *filter(None, [current])])


def worker_modules() -> None:
    """Allow `import vllm_marconi_offload.worker` with or without vLLM."""
    add_sources()
    if importlib.util.find_spec("vllm") is None:
        base = "vllm.distributed.kv_transfer.kv_connector.v1.base"
        parts = base.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            module = sys.modules.setdefault(name, types.ModuleType(name))
            module.__path__ = []  # type: ignore[attr-defined]
        stub = sys.modules[base]
        stub.KVConnectorMetadata = type("KVConnectorMetadata", (), {})  # type: ignore[attr-defined]
        stub.KVConnectorWorkerMetadata = type("KVConnectorWorkerMetadata", (), {})  # type: ignore[attr-defined]
    if "vllm_marconi_offload" not in sys.modules:
        package = types.ModuleType("vllm_marconi_offload")
        package.__path__ = [str(ROOT / "packages/vllm-marconi-offload/src/vllm_marconi_offload")]
        sys.modules["vllm_marconi_offload"] = package
