"""The two edits as pure functions on source strings."""

from __future__ import annotations

import ast
import textwrap

import pytest
from vllm_kv_astpatch._mechanism import FunctionNode, UnexpectedShapeError, find_function
from vllm_kv_astpatch._transforms import (
    guard_split_on_async_load,
    remove_external_connector_assert,
)


def fn(source: str, name: str = "f") -> FunctionNode:
    node = find_function(ast.parse(textwrap.dedent(source)), name)
    assert node is not None
    return node


def body(source: str, name: str = "f") -> str:
    return ast.unparse(fn(source, name))


@pytest.mark.parametrize(
    "test",
    [
        "num_external_computed_tokens == 0",
        "0 == num_external_computed_tokens",
        "(num_external_computed_tokens == 0)",
    ],
)
def test_assert_removed_in_either_operand_order(test: str) -> None:
    node = fn(
        f"def f(x, num_external_computed_tokens=0):\n    assert {test}, 'msg'\n    return x\n"
    )
    assert remove_external_connector_assert(node) == 1
    assert ast.unparse(node) == body("def f(x, num_external_computed_tokens=0):\n    return x\n")


def test_assert_without_message_and_nested_in_a_block() -> None:
    node = fn(
        """
        def f(x, num_external_computed_tokens=0):
            if x:
                assert num_external_computed_tokens == 0
            for i in range(x):
                pass
            return x
        """
    )
    assert remove_external_connector_assert(node) == 1
    assert ast.unparse(node) == body(
        """
        def f(x, num_external_computed_tokens=0):
            if x:
                pass
            for i in range(x):
                pass
            return x
        """
    )


@pytest.mark.parametrize(
    "test",
    [
        "num_external_computed_tokens != 0",
        "num_external_computed_tokens == 1",
        "num_external_computed_tokens == 0.0",
        "num_external_computed_tokens == False",
        "num_external_computed_tokens is 0",
        "num_external_computed_tokens <= 0",
        "0 == num_external_computed_tokens == 0",
        "self.num_external_computed_tokens == 0",
        "num_new_tokens == 0",
        "num_external_computed_tokens == 0 and x",
    ],
)
def test_similar_asserts_are_left_alone(test: str) -> None:
    source = f"def f(x, num_new_tokens=0, num_external_computed_tokens=0):\n    assert {test}\n"
    node = fn(source)
    assert remove_external_connector_assert(node) == 0
    assert ast.unparse(node) == body(source)


def test_nested_scopes_are_not_searched() -> None:
    source = """
    def f(num_external_computed_tokens=0):
        def inner(num_external_computed_tokens):
            assert num_external_computed_tokens == 0
        return inner
    """
    assert remove_external_connector_assert(fn(source)) == 0


def test_two_asserts_are_an_unexpected_shape() -> None:
    node = fn(
        """
        def f(num_external_computed_tokens=0):
            assert num_external_computed_tokens == 0
            assert 0 == num_external_computed_tokens
        """
    )
    with pytest.raises(UnexpectedShapeError, match="2 asserts"):
        remove_external_connector_assert(node)


def test_assert_on_a_name_that_is_not_a_parameter_is_unexpected() -> None:
    node = fn("def f(x):\n    assert num_external_computed_tokens == 0\n")
    with pytest.raises(UnexpectedShapeError, match="not a parameter"):
        remove_external_connector_assert(node)


def test_keyword_only_parameter_counts() -> None:
    node = fn(
        "def f(*, num_external_computed_tokens=0):\n    assert num_external_computed_tokens == 0\n"
    )
    assert remove_external_connector_assert(node) == 1


SCHEDULE = """
def schedule(self):
    load_kv_async = False
    if self.need_mamba_block_aligned_split:
        n = self._mamba_block_aligned_split(request, n)
    if self.need_mamba_block_aligned_split:
        n = self._mamba_block_aligned_split(request, n, local, num_external_computed_tokens)
        if n == 0:
            return
    return n
"""


def test_guard_rewrites_only_the_call_site_that_passes_external_tokens() -> None:
    node = fn(SCHEDULE, "schedule")
    assert guard_split_on_async_load(node) == 1
    expected = SCHEDULE.replace(
        "    if self.need_mamba_block_aligned_split:\n        n = self._mamba_block_aligned_split(request, n, local",
        "    if self.need_mamba_block_aligned_split and not load_kv_async:\n"
        "        n = self._mamba_block_aligned_split(request, n, local",
    )
    assert expected != SCHEDULE
    assert ast.unparse(node) == body(expected, "schedule")
    compile(ast.Module([node], []), "<test>", "exec")  # locations are complete


def test_guard_accepts_the_external_tokens_as_keyword() -> None:
    source = SCHEDULE.replace(
        "local, num_external_computed_tokens)",
        "local, num_external_computed_tokens=num_external_computed_tokens)",
    )
    assert guard_split_on_async_load(fn(source, "schedule")) == 1


def test_guard_already_present_is_not_needed() -> None:
    source = SCHEDULE.replace(
        "    if self.need_mamba_block_aligned_split:\n        n = self._mamba_block_aligned_split(request, n, local",
        "    if self.need_mamba_block_aligned_split and not load_kv_async:\n"
        "        n = self._mamba_block_aligned_split(request, n, local",
    )
    node = fn(source, "schedule")
    assert guard_split_on_async_load(node) == 0
    assert ast.unparse(node) == body(source, "schedule")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("local, num_external_computed_tokens)", "local, 0)"), "found 0"),
        (("load_kv_async = False", "other = False"), "no local variable"),
        (
            (
                "    return n\n",
                "    if self.need_mamba_block_aligned_split:\n"
                "        self._mamba_block_aligned_split(r, 0, 0, num_external_computed_tokens)\n"
                "    return n\n",
            ),
            "found 2",
        ),
    ],
)
def test_guard_unexpected_shapes(edit: tuple[str, str], message: str) -> None:
    source = SCHEDULE.replace(*edit)
    assert source != SCHEDULE
    with pytest.raises(UnexpectedShapeError, match=message):
        guard_split_on_async_load(fn(source, "schedule"))


def test_guard_inside_the_else_of_an_async_load_is_already_guarded() -> None:
    source = """
    def schedule(self):
        load_kv_async = self.x
        if load_kv_async:
            n = 0
        elif self.defer:
            return
        else:
            if self.need_mamba_block_aligned_split:
                n = self._mamba_block_aligned_split(r, n, local, num_external_computed_tokens)
        return n
    """
    node = fn(source, "schedule")
    assert guard_split_on_async_load(node) == 0
    assert ast.unparse(node) == body(source, "schedule")
