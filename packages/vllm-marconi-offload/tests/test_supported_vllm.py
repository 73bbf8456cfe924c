"""One supported vLLM range per plugin (`SUPPORTED_VLLM`), and every place that states it
agrees: the startup check, the `vllm` extra, the README tables and the versions the
project tests (nox matrix, the GPU benchmark kit). Reads the checkout; both plugins."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from vllm_marconi_offload import SUPPORTED_VLLM
from vllm_marconi_offload.compat import check_supported

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = {"vllm-marconi-offload": "vllm_marconi_offload", "memkv-vllm": "memkv_vllm"}
VERSION = re.compile(r"\b\d+\.\d+(?:\.\d+)?\b")

pytestmark = pytest.mark.skipif(
    not (ROOT / "noxfile.py").exists(), reason="needs the repository checkout"
)


def declared(plugin: str) -> str:
    """`SUPPORTED_VLLM` as written in the plugin's `_version.py`."""
    path = ROOT / "packages" / plugin / "src" / PLUGINS[plugin] / "_version.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "SUPPORTED_VLLM":
            return str(ast.literal_eval(node.value))
    raise AssertionError(f"{path} defines no SUPPORTED_VLLM")


def extra_range(plugin: str) -> SpecifierSet:
    """The specifier of the plugin's `vllm` extra (its package metadata)."""
    pyproject = tomllib.loads((ROOT / "packages" / plugin / "pyproject.toml").read_text())
    [spec] = pyproject["project"]["optional-dependencies"]["vllm"]
    requirement = Requirement(spec)
    assert requirement.name == "vllm"
    return requirement.specifier


def versions_the_project_runs() -> dict[str, str]:
    """Every vLLM version the project runs, with where: the nox matrix and the GPU kit."""
    found: dict[str, str] = {}
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) in (
            "VLLM_CPU_VERSIONS",
            "VLLM_GPU_ONLY_VERSIONS",
        ):
            for version in ast.literal_eval(node.value):
                found[version] = f"noxfile.py {ast.unparse(node.targets[0])}"
    kit = ROOT / "benchmarks" / "gpu" / "build.sh"
    for version in re.findall(r"\bvllm==(\S+)", kit.read_text()):
        found[version] = str(kit.relative_to(ROOT))
    return found


def readme_rows(plugin: str) -> list[tuple[str, str]]:
    """(vLLM column, status column) of each row of the README's *Supported vLLM versions*."""
    readme = (ROOT / "packages" / plugin / "README.md").read_text()
    heading = "\n## Supported vLLM versions\n"
    assert heading in readme, f"{plugin} README has no {heading.strip()!r}"
    section = readme.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and VERSION.search(cells[0]):
            rows.append((cells[0], cells[1]))
    return rows


def test_both_plugins_declare_one_range_in_their_metadata() -> None:
    for plugin in PLUGINS:
        assert declared(plugin) == SUPPORTED_VLLM, plugin
        assert extra_range(plugin) == SpecifierSet(SUPPORTED_VLLM), plugin


def test_every_tested_version_is_inside_and_passes_the_startup_check() -> None:
    versions = versions_the_project_runs()
    assert "0.26.0" in versions  # the GPU benchmarks' release
    for version, where in versions.items():
        assert SpecifierSet(SUPPORTED_VLLM).contains(version), (version, where)
        assert check_supported(version) is None, (version, where)
        assert check_supported(f"{version}+cpu") is None, (version, where)


def test_the_startup_check_warns_outside_the_range() -> None:
    for version in ("0.25.0", "0.34.0", "1.0.0", "unknown"):
        message = check_supported(version)
        assert message == f"vllm-marconi-offload supports vLLM {SUPPORTED_VLLM}; running {version}"


def test_readme_tables_agree_with_the_range() -> None:
    """Each plugin README states the range, lists as unsupported only versions outside it
    and every other version inside it; the root README's install line names it too."""
    for plugin in PLUGINS:
        readme = (ROOT / "packages" / plugin / "README.md").read_text()
        assert f'SUPPORTED_VLLM = "{SUPPORTED_VLLM}"`' in readme, plugin
        rows = readme_rows(plugin)
        assert rows, f"{plugin} README has no vLLM table"
        for versions, status in rows:
            outside = status.lower().startswith("not supported")
            for version in VERSION.findall(versions):
                inside = SpecifierSet(SUPPORTED_VLLM).contains(version)
                assert inside != outside, (plugin, versions, status)
    root = (ROOT / "README.md").read_text()
    assert f"supported: `{SUPPORTED_VLLM}`" in root
