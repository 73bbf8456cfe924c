"""Recompile one live function from its own source, transformed, and swap its code.

Only `__code__` of the live function object is replaced. Its globals, closure cells
(`__class__` included), defaults, keyword defaults, annotations, `__dict__` and
every decorator wrapper that holds it stay as they are. Nothing is executed while
patching (decorators and default values are not evaluated again) and no file is
touched.

The whole defining file is parsed, the function's def is edited in that tree, and the
tree is compiled (never executed), so scopes, imports, name mangling, `__future__`
flags and line numbers come out exactly as Python compiled them at import. Before
editing, the untouched tree is compiled and compared with the live code object; a
mismatch (a file edited since import, a function rebound by someone else) skips the
patch. Every failure raises `SkipError` with a short reason, and leaves
the function as it was.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import linecache
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
Transform = Callable[[FunctionNode], int]
"""Edits a function node in place and returns how many changes it made (0: none).

It raises `UnexpectedShapeError` when the function is not the shape it knows."""

_LOCK = threading.RLock()
"""Serialises every prepare-and-install sequence in the process."""


class UnexpectedShapeError(Exception):
    """The function's AST is not the shape a transform was written for."""


class SkipError(Exception):
    """A patch cannot be applied safely; nothing was changed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class FunctionTarget:
    """A function reached from a module by a dotted qualified name."""

    module: str
    qualname: str

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class Prepared:
    """A compiled replacement, not yet installed (`patched is None`: nothing to do)."""

    target: FunctionTarget
    function: types.FunctionType
    original: types.CodeType
    patched: types.CodeType | None
    changes: int
    already_applied: bool = False


@dataclass(frozen=True)
class _Swap:
    original: types.CodeType
    patched: types.CodeType


_SWAPS: weakref.WeakKeyDictionary[types.FunctionType, _Swap] = weakref.WeakKeyDictionary()


def lock() -> threading.RLock:
    """The process-wide lock held while patches are prepared and installed."""
    return _LOCK


def resolve(target: FunctionTarget) -> types.FunctionType:
    """Import `target.module` and return the plain function `target.qualname` names."""
    try:
        obj: object = importlib.import_module(target.module)
    except Exception as exc:  # any import failure means: leave it alone
        raise SkipError("import-error", f"{target.module}: {type(exc).__name__}: {exc}") from exc
    for part in target.qualname.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            raise SkipError("target-missing", f"{target} has no attribute {part!r}") from None
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    try:
        func = inspect.unwrap(obj) if callable(obj) else obj
    except ValueError as exc:  # a __wrapped__ cycle
        raise SkipError("unexpected-target", f"{target}: {exc}") from exc
    if not isinstance(func, types.FunctionType):
        raise SkipError("target-missing", f"{target} is a {type(func).__name__}, not a function")
    if not _qualname_matches(func.__code__.co_qualname, target.qualname):
        raise SkipError(
            "unexpected-target",
            f"{target} resolves to {func.__module__}.{func.__qualname__} "
            "(inherited, or wrapped without __wrapped__)",
        )
    return func


def _qualname_matches(code_qualname: str, qualname: str) -> bool:
    return code_qualname == qualname or code_qualname.endswith("." + qualname)


def find_function(
    tree: ast.Module, qualname: str, first_line: int | None = None
) -> FunctionNode | None:
    """The def statement named by a code object's `co_qualname` in a module's AST.

    With `first_line`, only a def whose first line (its first decorator's, if any)
    is that line counts; otherwise the first def of that name wins.
    """
    scopes: list[ast.AST] = [tree]
    for part in qualname.split("."):
        if part == "<locals>":
            continue
        scopes = [
            node
            for scope in scopes
            for node in _scope_statements(scope)
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == part
        ]
    defs = [n for n in scopes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if first_line is not None:
        defs = [n for n in defs if _first_line(n) == first_line]
    return defs[0] if defs else None


def _scope_statements(scope: ast.AST) -> list[ast.stmt]:
    """Statements of a scope, including those nested in if/for/while/with/try blocks."""
    found: list[ast.stmt] = []
    pending: list[ast.AST] = [scope]
    while pending:
        holder = pending.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for stmt in getattr(holder, field, ()) or ():
                found.append(stmt)
                if not isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    pending.append(stmt)
    return found


def _first_line(node: FunctionNode) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def is_patched(func: types.FunctionType) -> bool:
    """True while `func` runs code installed by `install`."""
    swap = _SWAPS.get(func)
    return swap is not None and func.__code__ is swap.patched


def prepare(target: FunctionTarget, transform: Transform) -> Prepared:
    """Resolve, read, verify, transform and compile `target`; raise `SkipError`."""
    func = resolve(target)
    with _LOCK:
        swap = _SWAPS.get(func)
        if swap is not None and func.__code__ is swap.patched:
            return Prepared(target, func, swap.original, swap.patched, 0, already_applied=True)
        original = func.__code__
        tree = _read_module(func)
        unchanged = _compile(tree, original)
        if unchanged is None or not same_code(unchanged, original):
            raise SkipError(
                "source-mismatch",
                f"the source of {target} does not compile to the live code "
                "(file edited after import, or function replaced at run time)",
            )
        edited_tree = copy.deepcopy(tree)
        edited = find_function(edited_tree, original.co_qualname, original.co_firstlineno)
        assert edited is not None  # _compile found it in the same tree
        try:
            changes = transform(edited)
        except UnexpectedShapeError as exc:
            raise SkipError("unexpected-ast", f"{target}: {exc}") from exc
        if changes == 0:
            return Prepared(target, func, original, None, 0)
        try:
            patched = _compile(edited_tree, original)
        except (SyntaxError, ValueError, TypeError) as exc:
            raise SkipError("compile-error", f"{target}: {type(exc).__name__}: {exc}") from exc
        if patched is None:
            raise SkipError("compile-error", f"{target}: the edited module lost the function")
        if patched.co_freevars != original.co_freevars:
            raise SkipError(
                "closure-mismatch",
                f"{target}: free variables {patched.co_freevars} != {original.co_freevars}",
            )
        return Prepared(target, func, original, patched, changes)


def install(prepared: Sequence[Prepared]) -> bool:
    """Swap in every prepared replacement, all or none; True if anything changed."""
    todo = [p for p in prepared if p.patched is not None and not p.already_applied]
    done: list[Prepared] = []
    with _LOCK:
        for item in todo:
            assert item.patched is not None
            if item.function.__code__ is not item.original:
                _roll_back(done)
                raise SkipError("concurrent-change", f"{item.target} changed while being patched")
            try:
                item.function.__code__ = item.patched
            except ValueError as exc:
                _roll_back(done)
                raise SkipError("install-error", f"{item.target}: {exc}") from exc
            _SWAPS[item.function] = _Swap(item.original, item.patched)
            done.append(item)
    return bool(done)


def restore(func: types.FunctionType) -> bool:
    """Put back the code `func` had before `install`; False if it was not patched."""
    with _LOCK:
        swap = _SWAPS.pop(func, None)
        if swap is None:
            return False
        if func.__code__ is swap.patched:
            func.__code__ = swap.original
        return True


def _roll_back(done: list[Prepared]) -> None:
    for item in reversed(done):
        item.function.__code__ = item.original
        _SWAPS.pop(item.function, None)


def _read_module(func: types.FunctionType) -> ast.Module:
    """Parse the whole file that defines `func` (compiling it whole keeps scopes,
    imports, name mangling, `__future__` flags and line numbers exactly as they were)."""
    filename = func.__code__.co_filename
    linecache.checkcache(filename)  # drop a cached copy of a file edited since
    lines = linecache.getlines(filename, func.__globals__)
    if not lines:
        raise SkipError("source-unavailable", f"no source for {func.__qualname__} in {filename!r}")
    try:
        tree = ast.parse("".join(lines), filename)
    except SyntaxError as exc:
        raise SkipError("parse-error", f"{filename}: {exc}") from exc
    code = func.__code__
    if find_function(tree, code.co_qualname, code.co_firstlineno) is None:
        raise SkipError(
            "source-mismatch",
            f"{filename} has no def of {code.co_qualname} at line {code.co_firstlineno}",
        )
    return tree


def _compile(tree: ast.Module, original: types.CodeType) -> types.CodeType | None:
    """Compile the module (never run it) and return the code of the original's function."""
    module_code = compile(tree, original.co_filename, "exec", dont_inherit=True)
    return _find_code(module_code, original.co_qualname, original.co_firstlineno)


def _find_code(code: types.CodeType, qualname: str, first_line: int) -> types.CodeType | None:
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        if const.co_qualname == qualname and const.co_firstlineno == first_line:
            return const
        found = _find_code(const, qualname, first_line)
        if found is not None:
            return found
    return None


_COMPARED = (
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_flags",
    "co_name",
)


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects do the same thing (line numbers are not compared)."""
    if any(getattr(a, attr) != getattr(b, attr) for attr in _COMPARED):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    return all(_same_const(x, y) for x, y in zip(a.co_consts, b.co_consts, strict=True))


def _same_const(x: object, y: object) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
        return same_code(x, y)
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(map(_same_const, x, y))
    if isinstance(x, frozenset) and isinstance(y, frozenset):
        return {(type(e), repr(e)) for e in x} == {(type(e), repr(e)) for e in y}
    if isinstance(x, float | complex):
        return repr(x) == repr(y)  # tells 0.0 from -0.0
    return x == y
