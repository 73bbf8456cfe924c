"""The hybrid-model patch on schedulers shaped like vLLM 0.22.1's and 0.23.0's."""

from __future__ import annotations

import sys
import threading
import types
import warnings
from pathlib import Path

import pytest
import vllm_kv_astpatch
from conftest import SCHEDULER_0_22, SCHEDULER_0_23, MakeModule
from vllm_kv_astpatch import _hybrid
from vllm_kv_astpatch._hybrid import HybridPatch, PatchSkipped, parse_version


def patch_for(module: object, version: str | None = "0.22.1") -> HybridPatch:
    return HybridPatch(module.__name__, version_of=lambda: version)  # type: ignore[attr-defined]


def test_applied_removes_the_assert_and_guards_async_loads(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    sched = mod.Scheduler()
    with pytest.raises(AssertionError, match="not verified"):
        sched.schedule(32, False)
    patch = patch_for(mod)

    report = patch.apply()

    assert (report.status, report.changed, report.vllm_version) == ("applied", True, "0.22.1")
    assert report.target == f"{mod.__name__}:Scheduler._mamba_block_aligned_split"
    assert report.patched == (
        f"{mod.__name__}:Scheduler._mamba_block_aligned_split",
        f"{mod.__name__}:Scheduler.schedule",
    )
    assert sched.schedule(32, False) == ("run", 32)  # sync external hit: split runs
    assert sched.schedule(32, True) == ("load", 0)  # async load starts instead of "stuck"
    assert report.as_dict()["status"] == "applied"


def test_idempotent_reapply_changes_nothing_and_says_so(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    patch = patch_for(mod)
    first = patch.apply()
    code = mod.Scheduler._mamba_block_aligned_split.__code__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = patch.apply()
    assert first.changed is True
    assert (second.status, second.changed) == ("applied", False)
    assert "already applied" in second.reason
    assert mod.Scheduler._mamba_block_aligned_split.__code__ is code
    # a second, independent patcher of the same functions also finds them patched
    third = patch_for(mod).apply()
    assert (third.status, third.changed) == ("applied", False)


def test_not_needed_on_the_fixed_scheduler(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_23)
    code = mod.Scheduler.schedule.__code__
    report = patch_for(mod, "0.33.0").apply()
    assert (report.status, report.changed, report.patched) == ("not-needed", False, ())
    assert mod.Scheduler.schedule.__code__ is code
    assert mod.Scheduler().schedule(32, True) == ("load", 0)


def test_revert_restores_both_functions(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    patch = patch_for(mod)
    patch.apply()
    assert patch.revert() is True
    assert patch.status == "not-applied"
    with pytest.raises(AssertionError):
        mod.Scheduler().schedule(32, False)
    assert mod.Scheduler().schedule(0, True) == "stuck"  # the guard is gone too
    assert patch.apply().changed is True  # can be applied again


def skipped(patch: HybridPatch) -> str:
    with pytest.warns(PatchSkipped) as record:
        report = patch.apply()
    assert len(record) == 1
    assert report.status in str(record[0].message)
    assert report.changed is False
    return report.status


def test_unexpected_schedule_shape_leaves_both_untouched(make_module: MakeModule) -> None:
    source = SCHEDULER_0_22.replace("        load_kv_async = is_async\n", "").replace(
        "load_kv_async", "is_async"
    )
    mod = make_module(source)
    assert skipped(patch_for(mod)) == "skipped-unexpected-ast"
    with pytest.raises(AssertionError):
        mod.Scheduler().schedule(32, False)  # the assert was not removed alone


def test_unexpected_split_shape(make_module: MakeModule) -> None:
    source = SCHEDULER_0_22.replace(
        "        num_computed_tokens = (",
        "        assert 0 == num_external_computed_tokens\n        num_computed_tokens = (",
    )
    assert skipped(patch_for(make_module(source))) == "skipped-unexpected-ast"


def test_unsupported_version_with_the_assert(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    assert skipped(patch_for(mod, "0.21.0")) == "skipped-unsupported-version"
    assert skipped(patch_for(mod, None)) == "skipped-unsupported-version"
    assert skipped(patch_for(mod, "0.23.0")) == "skipped-unsupported-version"
    assert patch_for(mod, "0.22.1+cpu").apply().status == "applied"


def test_source_missing(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    namespace: dict[str, object] = {}
    exec(compile(SCHEDULER_0_22, "<generated>", "exec"), namespace)
    mod.Scheduler = namespace["Scheduler"]
    assert skipped(patch_for(mod)) == "skipped-source-unavailable"


def test_target_missing(make_module: MakeModule) -> None:
    mod = make_module("class Scheduler:\n    def schedule(self):\n        pass\n")
    assert skipped(patch_for(mod)) == "skipped-target-missing"


def test_vllm_not_importable_is_retried() -> None:
    patch = HybridPatch("no_such_vllm.scheduler")
    assert skipped(patch) == "skipped-import-error"
    assert skipped(patch) == "skipped-import-error"  # tried again, warned again


def test_compile_error(make_module: MakeModule, monkeypatch: pytest.MonkeyPatch) -> None:
    import ast

    def broken(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
        node.body = [ast.Nonlocal(names=["nowhere"], lineno=node.lineno + 1, col_offset=8)]
        return 1

    monkeypatch.setattr(_hybrid, "remove_external_connector_assert", broken)
    mod = make_module(SCHEDULER_0_22)
    assert skipped(patch_for(mod)) == "skipped-compile-error"
    with pytest.raises(AssertionError):
        mod.Scheduler().schedule(32, False)


def test_internal_error_never_raises(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: object) -> object:
        raise RuntimeError("bug")

    monkeypatch.setattr(_hybrid._mechanism, "prepare", explode)
    assert skipped(patch_for(make_module(SCHEDULER_0_22))) == "skipped-internal-error"


@pytest.mark.parametrize("value", ["1", "true", "YES", "on", "anything"])
def test_disabled_by_environment(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("VLLM_KV_ASTPATCH_DISABLE", value)
    mod = make_module(SCHEDULER_0_22)
    patch = patch_for(mod)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user asked for it: no warning
        report = patch.apply()
    assert report.status == "skipped-disabled"
    with pytest.raises(AssertionError):
        mod.Scheduler().schedule(32, False)
    monkeypatch.setenv("VLLM_KV_ASTPATCH_DISABLE", "0")
    assert patch.apply().status == "applied"  # re-enabled later in the same process


def test_disabled_still_reports_not_needed(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KV_ASTPATCH_DISABLE", "1")
    assert patch_for(make_module(SCHEDULER_0_23)).apply().status == "not-needed"


def test_concurrent_apply_from_threads(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    patch = patch_for(mod)
    barrier = threading.Barrier(8)
    reports = []

    def worker() -> None:
        barrier.wait()
        reports.append(patch.apply())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [r.status for r in reports] == ["applied"] * 8
    assert sum(r.changed for r in reports) == 1
    assert mod.Scheduler().schedule(32, True) == ("load", 0)


def test_concurrent_apply_from_independent_patchers(make_module: MakeModule) -> None:
    mod = make_module(SCHEDULER_0_22)
    barrier = threading.Barrier(6)
    reports = []

    def worker() -> None:
        patch = patch_for(mod)
        barrier.wait()
        reports.append(patch.apply())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.status for r in reports] == ["applied"] * 6
    assert sum(r.changed for r in reports) == 1


def test_module_level_api_and_patch_status(
    monkeypatch: pytest.MonkeyPatch, make_module: MakeModule
) -> None:
    mod = make_module(SCHEDULER_0_22)
    monkeypatch.setattr(_hybrid, "DEFAULT", patch_for(mod))
    assert vllm_kv_astpatch.PATCH_STATUS == "not-applied"
    assert vllm_kv_astpatch.patch_report().reason == "apply() was not called"
    assert vllm_kv_astpatch.hybrid_external_hits_supported() is True
    assert vllm_kv_astpatch.PATCH_STATUS == "applied"
    assert vllm_kv_astpatch.apply_hybrid_patch().changed is False
    assert vllm_kv_astpatch.revert_hybrid_patch() is True
    assert vllm_kv_astpatch.PATCH_STATUS == "not-applied"
    with pytest.raises(AttributeError):
        vllm_kv_astpatch.NOT_A_THING  # noqa: B018


def test_hits_not_supported_when_skipped(
    monkeypatch: pytest.MonkeyPatch, make_module: MakeModule
) -> None:
    monkeypatch.setattr(_hybrid, "DEFAULT", patch_for(make_module(SCHEDULER_0_22), "0.21.0"))
    with pytest.warns(PatchSkipped):
        assert vllm_kv_astpatch.hybrid_external_hits_supported() is False


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0.22.1", (0, 22, 1)),
        ("0.22.1+cpu", (0, 22, 1)),
        ("0.23", (0, 23, 0)),
        ("0.22.2.dev3+gabc", (0, 22, 2)),
        ("", None),
        (None, None),
        ("dev", None),
    ],
)
def test_parse_version(text: str | None, parsed: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == parsed


def test_reentrant_apply_during_the_import_does_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module whose import calls apply() on the very patch that is importing it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "astpatch_reentrant_scheduler"
    (tmp_path / f"{name}.py").write_text(
        "import astpatch_reentry\n_INNER = astpatch_reentry.patch.apply()\n" + SCHEDULER_0_22
    )
    holder = types.ModuleType("astpatch_reentry")
    holder.patch = HybridPatch(name, version_of=lambda: "0.22.1")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "astpatch_reentry", holder)
    try:
        report = holder.patch.apply()  # type: ignore[attr-defined]
        inner = sys.modules[name]._INNER
    finally:
        sys.modules.pop(name, None)
    assert report.status == "applied"
    assert (inner.status, inner.reason) == ("not-applied", "apply() is already running")


@pytest.mark.parametrize(
    ("value", "disabled"),
    [("", False), ("0", False), ("false", False), ("No", False), (" off ", False), ("1", True)],
)
def test_is_disabled_values(value: str, disabled: bool) -> None:
    assert _hybrid.is_disabled({"VLLM_KV_ASTPATCH_DISABLE": value}) is disabled
    assert _hybrid.is_disabled({}) is False
