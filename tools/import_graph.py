"""The import graph inside each package of packages/*/src, and its cycles.

An edge `a -> b` means module `a` imports module `b` of the same package, wherever the
import statement is: at module level, inside a function (a lazy import still runs), or
under `if TYPE_CHECKING:` (two modules that name each other's types are one unit in two
files). `from pkg import name` counts as an import of `pkg.name` when that is a module,
else of `pkg` itself. Importing a module also runs its parents' `__init__`; those
implicit edges are left out, as import checkers do.

    python tools/import_graph.py            # every package's cycles; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_sources() -> dict[str, Path]:
    """Import name -> source folder, for every package under packages/*/src."""
    return {
        init.parent.name: init.parent for init in sorted(ROOT.glob("packages/*/src/*/__init__.py"))
    }


def modules(folder: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package in `folder`."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` statement names."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    known = modules(folder)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node)
                submodules = [f"{source}.{a.name}" for a in node.names]
                targets = [m for m in submodules if m in known]
                if len(targets) < len(submodules):  # some names are attributes of `source`
                    targets.append(source)
            else:
                continue
            edges[name].update(t for t in targets if t in known and t != name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graphs are small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def main() -> int:
    status = 0
    for package, folder in package_sources().items():
        for component in cycles(graph(folder)):
            print(f"{package}: import cycle among {', '.join(component)}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
