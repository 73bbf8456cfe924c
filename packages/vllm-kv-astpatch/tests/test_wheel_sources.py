"""The transforms on the real ``vllm/v1/core/sched/scheduler.py`` of published wheels.

The ``astpatch-wheels`` nox session downloads the wheels (never installs them), puts
each file at ``$VLLM_KV_ASTPATCH_WHEEL_SOURCES/<version>/scheduler.py`` and runs this
module; without that variable these tests are skipped.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from vllm_kv_astpatch._hybrid import SUPPORTED_VLLM, parse_version
from vllm_kv_astpatch._mechanism import FunctionNode, find_function
from vllm_kv_astpatch._transforms import (
    guard_split_on_async_load,
    remove_external_connector_assert,
)

ROOT = os.environ.get("VLLM_KV_ASTPATCH_WHEEL_SOURCES")
SOURCES = sorted(Path(ROOT).glob("*/scheduler.py")) if ROOT else []
pytestmark = pytest.mark.skipif(not ROOT, reason="set by the astpatch-wheels nox session")

SPLIT = "Scheduler._mamba_block_aligned_split"
SCHEDULE = "Scheduler.schedule"


def version_of(path: Path) -> str:
    return path.parent.name


def function(source: str, qualname: str) -> FunctionNode:
    node = find_function(ast.parse(source), qualname)
    assert node is not None, qualname
    return node


def has_assert(version: str) -> bool:
    """What the research found: only 0.22.1 of the inspected releases has the assert."""
    parsed = parse_version(version)
    assert parsed is not None
    return parsed < (0, 23, 0)


def test_sources_were_provided() -> None:
    versions = {version_of(p) for p in SOURCES}
    assert "0.22.1" in versions
    assert any(has_assert(v) is False for v in versions)


@pytest.mark.parametrize("path", SOURCES, ids=version_of)
def test_assert_removal_matches_a_hand_edit(path: Path) -> None:
    source = path.read_text()
    node = function(source, SPLIT)
    changes = remove_external_connector_assert(node)
    if not has_assert(version_of(path)):
        assert changes == 0
        assert "External KV connector is not verified" not in source
        return
    assert changes == 1
    # the expected result, edited as text: drop the lines of the assert statement
    lines = source.splitlines(keepends=True)
    start = next(
        i for i, line in enumerate(lines) if "assert num_external_computed_tokens == 0" in line
    )
    end = start
    while not lines[end].rstrip().endswith(")"):
        end += 1
    assert "not verified yet" in "".join(lines[start : end + 1])
    expected = "".join(lines[:start] + lines[end + 1 :])
    assert ast.unparse(node) == ast.unparse(function(expected, SPLIT))
    assert ast.unparse(node) != ast.unparse(function(source, SPLIT))


@pytest.mark.parametrize("path", SOURCES, ids=version_of)
def test_async_guard_matches_a_hand_edit_or_upstream(path: Path) -> None:
    source = path.read_text()
    node = function(source, SCHEDULE)
    version = version_of(path)
    if not has_assert(version):
        # later releases have upstream's guard (0.23 on) or call the split only in the
        # synchronous branch (0.33): already guarded, though the patch never edits them
        assert guard_split_on_async_load(node) == 0
        return
    assert guard_split_on_async_load(node) == 1
    pattern = re.compile(
        r"^(\s*)if self\.need_mamba_block_aligned_split:\n"
        r"((?:\1    .*\n){1,6}?\1        num_external_computed_tokens,\n)",
        re.MULTILINE,
    )
    expected, count = pattern.subn(
        r"\1if self.need_mamba_block_aligned_split and not load_kv_async:\n\2", source
    )
    assert count == 1
    assert ast.unparse(node) == ast.unparse(function(expected, SCHEDULE))


@pytest.mark.parametrize("path", SOURCES, ids=version_of)
def test_edited_module_compiles(path: Path) -> None:
    tree = ast.parse(path.read_text())
    split = find_function(tree, SPLIT)
    schedule = find_function(tree, SCHEDULE)
    assert split is not None
    assert schedule is not None
    if remove_external_connector_assert(split):
        assert guard_split_on_async_load(schedule) == 1
    compile(tree, str(path), "exec", dont_inherit=True)


def test_supported_range_covers_exactly_the_releases_with_the_assert() -> None:
    low, high = SUPPORTED_VLLM
    for path in SOURCES:
        parsed = parse_version(version_of(path))
        assert parsed is not None
        assert (low <= parsed < high) == has_assert(version_of(path))
