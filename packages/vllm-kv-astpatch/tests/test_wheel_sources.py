"""The transforms on the real `vllm/v1/core/sched/scheduler.py` of published wheels.

The `astpatch-wheels` nox session downloads the wheels (never installs them), puts
each file at `$VLLM_KV_ASTPATCH_WHEEL_SOURCES/<version>/scheduler.py` and runs this
module; without that variable these tests are skipped.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_kv_astpatch._hybrid import SUPPORTED_VLLM, HybridPatch, parse_version
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


# --- the whole pipeline on the real file ---------------------------------------------------
# The wheel's scheduler.py is executed as a module whose `vllm` imports are stand-ins, so
# the live functions are compiled from the real file: prepare() must verify them against
# a recompile of that file, install the edits, and the split must then accept external
# tokens.


class _StandIn(type):
    """Any name imported from vLLM: subclassable, subscriptable, callable, union-able."""

    def __getattr__(cls, name: str) -> _StandIn:
        return _StandIn(name, (), {})

    def __getitem__(cls, item: object) -> _StandIn:
        return cls

    def __or__(cls, other: object) -> _StandIn:
        return cls

    def __ror__(cls, other: object) -> _StandIn:
        return cls

    def __call__(cls, *args: object, **kwargs: object) -> object:
        return cls


def _load_with_stand_ins(path: Path, name: str) -> types.ModuleType:
    real_import = builtins.__import__

    def fake_import(
        module: str,
        globals: object = None,
        locals: object = None,
        fromlist: object = (),
        level: int = 0,
    ) -> object:
        if module == "vllm" or module.startswith("vllm."):
            return _StandIn(module, (), {})
        return real_import(module, globals, locals, fromlist, level)  # type: ignore[arg-type]

    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    mod.__builtins__ = {**vars(builtins), "__import__": fake_import}  # type: ignore[attr-defined]
    exec(compile(path.read_text(), str(path), "exec", dont_inherit=True), mod.__dict__)
    return mod


@pytest.fixture
def real_module(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[types.ModuleType]:
    source: Path = request.param
    name = f"astpatch_real_scheduler_{version_of(source).replace('.', '_')}"
    copy = tmp_path / f"{name}.py"
    copy.write_text(source.read_text())
    sys.modules[name] = _load_with_stand_ins(copy, name)
    yield sys.modules[name]
    del sys.modules[name]


@pytest.mark.parametrize("real_module", SOURCES, ids=version_of, indirect=True)
def test_hybrid_patch_on_the_real_file(real_module: types.ModuleType) -> None:
    version = real_module.__name__.removeprefix("astpatch_real_scheduler_").replace("_", ".")
    split = real_module.Scheduler._mamba_block_aligned_split
    schedule = real_module.Scheduler.schedule
    codes = (split.__code__, schedule.__code__)
    this = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=16),
        use_eagle=False,
        use_eagle_block_drop=False,
    )
    request = SimpleNamespace(num_computed_tokens=0, num_prompt_tokens=100, num_tokens=100)

    report = HybridPatch(real_module.__name__, version_of=lambda: version).apply()

    if not has_assert(version):
        assert report.status == "not-needed"
        assert (split.__code__, schedule.__code__) == codes
        return
    assert report.status == "applied", report
    assert report.changed
    assert split.__code__ is not codes[0]
    assert schedule.__code__ is not codes[1]
    # 16 external tokens, 50 new: the chunk is cut to a block boundary (48), no assert
    assert split(this, request, 50, 0, 16) == 48


def test_patched_split_of_0_22_1_is_upstreams_0_23_0() -> None:
    by_version = {version_of(p): p.read_text() for p in SOURCES}
    if not {"0.22.1", "0.23.0"} <= by_version.keys():
        pytest.skip("needs the 0.22.1 and 0.23.0 sources")
    patched = function(by_version["0.22.1"], SPLIT)
    assert remove_external_connector_assert(patched) == 1
    assert ast.unparse(patched) == ast.unparse(function(by_version["0.23.0"], SPLIT))
