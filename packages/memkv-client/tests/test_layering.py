"""The client/server seam: the two sides meet only in shared modules."""

from __future__ import annotations

import ast
from pathlib import Path

import memkv_client

PKG = Path(memkv_client.__file__).parent
SHARED = {"protocol", "auth", "errors", "verbs", "sockio", "_version"}
SERVER_ONLY = {"server"}


def _imports(path: Path) -> set[str]:
    """First-level memkv_client modules imported by `path` (relative or absolute)."""
    inside_server = path.parent.name == "server"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 0 and mod.startswith("memkv_client."):
                out.add(mod.split(".")[1])
            elif node.level == 1 and inside_server:
                continue  # a sibling inside server/
            elif node.level >= 1:
                names = [mod] if mod else [a.name for a in node.names]
                out.update(n.split(".")[0] for n in names)
        elif isinstance(node, ast.Import):
            out.update(
                a.name.split(".")[1] for a in node.names if a.name.startswith("memkv_client.")
            )
    return out


def test_server_imports_only_shared_modules() -> None:
    for path in sorted((PKG / "server").glob("*.py")):
        assert _imports(path) <= SHARED, f"{path.name} imports client modules"


def test_client_never_imports_the_server() -> None:
    for path in sorted(PKG.glob("*.py")):
        if path.name in ("cli.py", "bench.py", "__init__.py"):
            continue  # the command line and the benchmark start servers on purpose
        assert not _imports(path) & SERVER_ONLY, f"{path.name} imports the server"
