"""The two AST edits of the hybrid-model patch, as pure functions on function nodes.

Both search the function's own statements (nested blocks included, nested functions,
lambdas and classes excluded: a name there may mean something else) and change only
nodes of one exact shape.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ._mechanism import FunctionNode, UnexpectedShapeError

EXTERNAL_TOKENS = "num_external_computed_tokens"
LOAD_KV_ASYNC = "load_kv_async"
SPLIT_FLAG = "need_mamba_block_aligned_split"
SPLIT_METHOD = "_mamba_block_aligned_split"

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _own_nodes(root: ast.AST) -> Iterator[ast.AST]:
    """Every node under `root` that belongs to its scope (not to a nested one)."""
    for child in ast.iter_child_nodes(root):
        if isinstance(child, _SCOPES):
            continue
        yield child
        yield from _own_nodes(child)


def _parameter_names(func: FunctionNode) -> set[str]:
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return {arg.arg for arg in every if arg is not None}


def _is_zero(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 0


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def is_external_tokens_assert(node: ast.AST) -> bool:
    """`assert num_external_computed_tokens == 0[, msg]` (or `0 == ...`)."""
    if not isinstance(node, ast.Assert):
        return False
    test = node.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and len(test.comparators) == 1
    ):
        return False
    left, right = test.left, test.comparators[0]
    return (_is_name(left, EXTERNAL_TOKENS) and _is_zero(right)) or (
        _is_zero(left) and _is_name(right, EXTERNAL_TOKENS)
    )


def remove_external_connector_assert(func: FunctionNode) -> int:
    """Delete the hybrid-model guard `assert num_external_computed_tokens == 0`.

    Requires `num_external_computed_tokens` to be a parameter of `func`. More than
    one matching assert is an unexpected shape. A block left empty gets `pass`.
    """
    if EXTERNAL_TOKENS not in _parameter_names(func):
        if any(is_external_tokens_assert(n) for n in _own_nodes(func)):
            raise UnexpectedShapeError(f"asserts on {EXTERNAL_TOKENS}, which is not a parameter")
        return 0
    matches = [n for n in _own_nodes(func) if is_external_tokens_assert(n)]
    if len(matches) > 1:
        raise UnexpectedShapeError(f"{len(matches)} asserts on {EXTERNAL_TOKENS} (expected one)")
    if not matches:
        return 0
    target = matches[0]
    for holder in [func, *_own_nodes(func)]:
        for field in _BLOCKS:
            block = getattr(holder, field, None)
            if isinstance(block, list) and any(stmt is target for stmt in block):
                block[:] = [stmt for stmt in block if stmt is not target] or [ast.Pass()]
                return 1
    raise UnexpectedShapeError("the assert is not a statement of a block")  # pragma: no cover


def _is_split_flag(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute) and node.attr == SPLIT_FLAG and _is_name(node.value, "self")
    )


def _is_async_guard(node: ast.expr) -> bool:
    """`self.need_mamba_block_aligned_split and not load_kv_async` (already guarded)."""
    return (
        isinstance(node, ast.BoolOp)
        and isinstance(node.op, ast.And)
        and any(_is_split_flag(v) for v in node.values)
        and any(
            isinstance(v, ast.UnaryOp)
            and isinstance(v.op, ast.Not)
            and _is_name(v.operand, LOAD_KV_ASYNC)
            for v in node.values
        )
    )


def _passes_external_tokens(node: ast.If) -> bool:
    """The block calls `self._mamba_block_aligned_split(..., num_external_computed_tokens)`."""
    for sub in (n for stmt in node.body for n in [stmt, *_own_nodes(stmt)]):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == SPLIT_METHOD
            and _is_name(sub.func.value, "self")
            and (
                any(_is_name(a, EXTERNAL_TOKENS) for a in sub.args)
                or any(_is_name(k.value, EXTERNAL_TOKENS) for k in sub.keywords)
            )
        ):
            return True
    return False


def _only_without_async_load(func: FunctionNode) -> set[int]:
    """Ids of nodes reached only in the `else` of `if load_kv_async:` (vLLM 0.33)."""
    found: set[int] = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.If) and _is_name(node.test, LOAD_KV_ASYNC):
            for stmt in node.orelse:
                found.add(id(stmt))
                found.update(id(sub) for sub in _own_nodes(stmt))
    return found


def guard_split_on_async_load(func: FunctionNode) -> int:
    """SkipError the split while a request only sets up an asynchronous external load.

    Rewrites `if self.need_mamba_block_aligned_split:` around the call that passes
    `num_external_computed_tokens` into `if self.need_mamba_block_aligned_split and
    not load_kv_async:`. Otherwise the split returns 0 for the zero-token step that
    starts the load, the scheduler stops before allocating, and the load never starts.
    Returns 0 when the call site is already guarded (upstream's `and not
    load_kv_async`, or the `else` of `if load_kv_async:`); raises `UnexpectedShapeError`
    when there is no such call site, more than one, or no `load_kv_async` variable.
    """
    assigned = {
        n.id for n in _own_nodes(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    ifs = [n for n in _own_nodes(func) if isinstance(n, ast.If) and _passes_external_tokens(n)]
    sync_only = _only_without_async_load(func)
    guarded = [n for n in ifs if _is_async_guard(n.test) or id(n) in sync_only]
    ifs = [n for n in ifs if id(n) not in sync_only]
    unguarded = [n for n in ifs if _is_split_flag(n.test)]
    if guarded and not unguarded:
        return 0
    if len(unguarded) != 1 or guarded:
        raise UnexpectedShapeError(
            f"expected one 'if self.{SPLIT_FLAG}:' around the split of new requests, "
            f"found {len(unguarded)} (and {len(guarded)} guarded)"
        )
    if LOAD_KV_ASYNC not in assigned | _parameter_names(func):
        raise UnexpectedShapeError(f"no local variable {LOAD_KV_ASYNC!r}")
    node = unguarded[0]
    not_async = ast.UnaryOp(ast.Not(), ast.Name(LOAD_KV_ASYNC, ast.Load()))
    node.test = ast.copy_location(ast.BoolOp(ast.And(), [node.test, not_async]), node.test)
    ast.fix_missing_locations(node)
    return 1
