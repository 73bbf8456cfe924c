"""No hidden knobs: every environment variable of this project (`MEMKV_*`,
`MARCONI_OFFLOAD_*`, `VLLM_MARCONI_OFFLOAD_*`, `VLLM_KV_ASTPATCH_*`) that a package's
source names is in that package's README."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from import_graph import package_sources

VARIABLE = re.compile(
    r"""["'](?P<name>(?:MEMKV|(?:VLLM_)?MARCONI_OFFLOAD|VLLM_KV_ASTPATCH)_[A-Z0-9_]+)["']"""
)


def variables(folder: Path) -> set[str]:
    """The project's variables named as string literals in the sources under `folder`."""
    return {m["name"] for path in folder.rglob("*.py") for m in VARIABLE.finditer(path.read_text())}


@pytest.mark.parametrize("package", sorted(package_sources()))
def test_every_variable_a_package_reads_is_in_its_readme(package: str) -> None:
    folder = package_sources()[package]
    readme = (folder.parents[1] / "README.md").read_text()
    hidden = sorted(name for name in variables(folder) if f"`{name}`" not in readme)
    assert hidden == [], f"{package} reads variables its README does not name: {hidden}"


def test_a_hidden_variable_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('import os\nos.environ.get("MEMKV_SECRET_KNOB")\n')
    assert variables(tmp_path) == {"MEMKV_SECRET_KNOB"}
