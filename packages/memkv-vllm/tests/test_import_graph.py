"""memkv-vllm's modules import each other without circles, counting every import: at
module level, inside functions and under `TYPE_CHECKING`."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import memkv_vllm

PACKAGE = Path(memkv_vllm.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["memkv_vllm", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's own modules that `path` (module `name`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports a module; `from mod import name` the module
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            if target in modules:
                found.add(target)
                break
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {name: _imports(path, name, modules) for name, path in files.items()}


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert graph["memkv_vllm.spec"] >= {"memkv_vllm.direct_manager"}  # the parser sees edges
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_backends_are_imported_only_by_name() -> None:
    graph = import_graph()
    backends = {"memkv_vllm.store.memkv", "memkv_vllm.store.mooncake"}
    importers = {name for name, targets in graph.items() if targets & backends}
    assert importers == set(), importers  # `.store.registry` resolves them lazily
