"""What differs between vLLM releases lives in each plugin's compat module only
(docs/architecture.md): no other module of vllm-marconi-offload or memkv-vllm reads vLLM's
version, probes a vLLM object with `hasattr` / `getattr(..., default)`, or tries a vLLM
import and catches its failure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = {
    "vllm_marconi_offload": ROOT / "packages/vllm-marconi-offload/src/vllm_marconi_offload",
    "memkv_vllm": ROOT / "packages/memkv-vllm/src/memkv_vllm",
}
COMPAT = {"vllm_marconi_offload": "compat.py", "memkv_vllm": "_compat.py"}
COMPAT_MODULES = {"compat", "_compat"}
VLLM_CONFIG = "vllm_config"
NOT_YET_MOVED: dict[str, str] = {}
"""Modules whose probes are known and still to move (strict: a module that passes must
leave this list)."""
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


def _vllm_names(tree: ast.Module) -> set[str]:
    """Names a module binds to vLLM (`import vllm.x as y`, `from vllm.x import Z`) or to
    its compat module (`from . import _compat as c`: `c.X` is a vLLM object)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name.split(".")[0]) for a in node.names if _is_vllm(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_vllm(node.module):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            if node.module in COMPAT_MODULES:
                names |= {a.asname or a.name for a in node.names}
            elif node.module is None:
                names |= {a.asname or a.name for a in node.names if a.name in COMPAT_MODULES}
    return names


def _mentions(node: ast.AST | None, names: set[str]) -> bool:
    """Whether `node` names one of `names`, or a vLLM config (`...vllm_config...`)."""
    if node is None:
        return False
    words = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return bool(words & names) or VLLM_CONFIG in ast.unparse(node).lower()


def _vllm_objects(tree: ast.Module) -> set[str]:
    """The names that hold vLLM objects: bound to vLLM, parameters annotated with a vLLM
    type (or named `vllm_config`), and names assigned from such objects."""
    names = _vllm_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            names |= {a.arg for a in params if _mentions(a.annotation, names)}
            names |= {a.arg for a in params if VLLM_CONFIG in a.arg.lower()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _mentions(node.value, names):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _root(node: ast.expr) -> str:
    """The text of `node` (`self._vllm_config.model_config` for an attribute chain)."""
    return ast.unparse(node)


def _touches_vllm(node: ast.expr, vllm_names: set[str]) -> bool:
    """Whether `node` is a vLLM object: rooted at a name that holds one, or a vLLM
    config (`vllm_config`, `self._vllm_config.kv_transfer_config`)."""
    base = node
    while isinstance(base, ast.Attribute | ast.Subscript | ast.Call):
        base = base.func if isinstance(base, ast.Call) else base.value
    if isinstance(base, ast.Name) and base.id in vllm_names:
        return True
    return VLLM_CONFIG in _root(node).lower()


def _imports_vllm(statements: list[ast.stmt]) -> bool:
    for node in (n for s in statements for n in ast.walk(s)):
        if isinstance(node, ast.Import) and any(_is_vllm(a.name) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and _is_vllm(node.module):
            return True
        if (
            isinstance(node, ast.Call)
            and _root(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and _is_vllm(str(node.args[0].value))
        ):
            return True
    return False


def _catches_import_errors(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(_root(kind).split(".")[-1] in IMPORT_ERRORS for kind in kinds)


def _probe(node: ast.AST, vllm_names: set[str]) -> str | None:
    """What `node` does if it reads vLLM's version or probes vLLM, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "__version__":
        return f"reads {_root(node)}" if _touches_vllm(node.value, vllm_names) else None
    if isinstance(node, ast.ImportFrom) and _is_vllm(node.module):
        versions = any(a.name == "__version__" for a in node.names)
        return "imports vllm.__version__" if versions else None
    if isinstance(node, ast.Try):
        caught = any(_catches_import_errors(h) for h in node.handlers)
        return "try-import of vLLM" if caught and _imports_vllm(node.body) else None
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name, first = _root(node.func).split(".")[-1], node.args[0]
    metadata = name in ("version", "distribution", "find_spec") and (
        isinstance(first, ast.Constant) and _is_vllm(str(first.value))
    )
    probe = (name == "hasattr" or (name == "getattr" and len(node.args) == 3)) and (
        _touches_vllm(first, vllm_names)
    )
    return _root(node) if metadata or probe else None


def probes(source: str) -> list[str]:
    """Each place in `source` that reads vLLM's version or probes vLLM, as `line: what`."""
    tree = ast.parse(source)
    vllm_names = _vllm_objects(tree)
    found = []
    for node in ast.walk(tree):
        what = _probe(node, vllm_names)
        if what is not None:
            found.append(f"{getattr(node, 'lineno', 0)}: {what}")
    return found


def _modules() -> list[object]:
    params: list[object] = []
    for package, folder in PLUGINS.items():
        for path in sorted(folder.rglob("*.py")):
            name = f"{package}/{path.relative_to(folder).as_posix()}"
            if name == f"{package}/{COMPAT[package]}":
                continue
            pending = NOT_YET_MOVED.get(name)
            marks = [pytest.mark.xfail(reason=pending, strict=True)] if pending else []
            params.append(pytest.param(package, path, id=name, marks=marks))
    return params


@pytest.mark.parametrize(("package", "path"), _modules())
def test_only_the_compat_module_reads_vllm_versions_or_probes_vllm(
    package: str, path: Path
) -> None:
    found = probes(path.read_text())
    assert not found, (
        f"{path.relative_to(ROOT)}: vLLM release differences belong in "
        f"{package}/{COMPAT[package]}: " + "; ".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "import vllm\nv = vllm.__version__\n",
        "from vllm import __version__\n",
        "from importlib.metadata import version\nv = version('vllm')\n",
        "import importlib.metadata\nv = importlib.metadata.version('vllm')\n",
        "from vllm.config import VllmConfig\nok = hasattr(VllmConfig, 'kv_events_config')\n",
        "def f(vllm_config):\n    return getattr(vllm_config, 'kv_events_config', None)\n",
        "try:\n    from vllm.v1 import x\nexcept ImportError:\n    x = None\n",
        "try:\n    import vllm.envs as envs\nexcept (ModuleNotFoundError, AttributeError):\n    pass\n",
    ],
)
def test_each_kind_of_probe_is_found(source: str) -> None:
    assert probes(source)


def test_plain_uses_of_vllm_are_not_probes() -> None:
    source = (
        "from vllm.config import VllmConfig\n"
        "def f(vllm_config: VllmConfig, data):\n"
        "    getattr(data, 'x', None)\n"
        "    return vllm_config.model_config\n"
    )
    assert probes(source) == []
