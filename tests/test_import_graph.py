"""No package imports itself in a circle (tools/import_graph.py: every import statement
counts, lazy and TYPE_CHECKING ones too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from import_graph import cycles, graph, package_sources


@pytest.mark.parametrize("package", sorted(package_sources()))
def test_the_package_imports_nothing_in_a_circle(package: str) -> None:
    assert cycles(graph(package_sources()[package])) == []


def test_a_cycle_through_a_lazy_or_type_only_import_is_found(tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "a.py").write_text("from .b import B\n")
    (folder / "b.py").write_text("def f():\n    from . import c\n")
    (folder / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    (folder / "d.py").write_text("from . import a, b\n")
    assert cycles(graph(folder)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_memkv_vllm_store_backends_are_imported_only_by_name() -> None:
    edges = graph(package_sources()["memkv_vllm"])
    backends = {"memkv_vllm.store.memkv", "memkv_vllm.store.mooncake"}
    assert backends <= set(edges)
    importers = {module for module, targets in edges.items() if targets & backends}
    assert importers == set()  # memkv_vllm.store.registry resolves them lazily, by name
