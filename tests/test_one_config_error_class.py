"""One configuration error: every class a package names `ConfigError` is, or derives from,
`kv_offload_settings.ConfigError`, so one `except` catches a bad setting of any package."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from import_graph import modules, package_sources

PUBLIC = ("kv_offload_settings", "kvpool_mmap", "memkv_client", "vllm_marconi_offload")
"""Packages that export `ConfigError` at their top level."""


def config_error_classes() -> list[tuple[str, str]]:
    """(module, class name) of every class whose name ends in `ConfigError`."""
    found = []
    for folder in package_sources().values():
        for module, path in modules(folder).items():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith("ConfigError"):
                    found.append((module, node.name))
    return found


@pytest.mark.parametrize(("module", "name"), config_error_classes())
def test_every_config_error_is_the_kits(module: str, name: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed in this session")
    kit = importlib.import_module("kv_offload_settings").ConfigError
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, kit), f"{module}.{name} does not derive from {kit}"


@pytest.mark.parametrize("package", PUBLIC)
def test_the_public_config_error_is_the_kits(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed in this session")
    kit = importlib.import_module("kv_offload_settings").ConfigError
    assert issubclass(importlib.import_module(package).ConfigError, kit)
