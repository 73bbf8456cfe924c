"""Make the repository's packages importable from their source folders (no install needed).

`add_sources()` also declares the packages' entry points (e.g. kv-eviction's policies,
found by name through `kv_eviction.policies`) in a dist-info folder on the path, as an
install would, except vLLM plugins (`vllm.general_plugins`): a benchmark registers those
it runs itself.

`worker_modules()` also lets the connector's worker-side modules load where vLLM is not
installed yet (the first kit run): it skips the package `__init__` (which imports the
vLLM connector base) and, only if vLLM is missing, supplies the two metadata base classes
the worker's messages derive from.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import tomllib
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_ENTRY_POINTS = {"vllm.general_plugins"}


def add_sources() -> None:
    """Put every `packages/*/src` on sys.path and on PYTHONPATH (for vLLM's subprocesses)."""
    sources = [str(src) for src in sorted((ROOT / "packages").glob("*/src"))]
    sources.append(str(_entry_points()))
    for src in sources:
        if src not in sys.path:
            sys.path.insert(0, src)
    current = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([*sources, *filter(None, [current])])


def _entry_points() -> Path:
    """A folder with a dist-info for each package that declares entry points (but vLLM's)."""
    folder = Path(tempfile.gettempdir()) / f"repo-entry-points-{os.getuid()}"
    for project in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        meta = tomllib.loads(project.read_text())["project"]
        groups = {
            group: entries
            for group, entries in meta.get("entry-points", {}).items()
            if group not in SKIPPED_ENTRY_POINTS
        }
        if not groups:
            continue
        name = meta["name"].replace("-", "_")
        info = folder / f"{name}-0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: 0\n")
        lines = [
            line
            for group, entries in groups.items()
            for line in (f"[{group}]", *(f"{key} = {value}" for key, value in entries.items()))
        ]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return folder


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
