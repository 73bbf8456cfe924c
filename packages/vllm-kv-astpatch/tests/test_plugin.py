"""The vllm.general_plugins entry point."""

from __future__ import annotations

import importlib.metadata
import logging

import pytest
from conftest import SCHEDULER_0_22, SCHEDULER_0_23, MakeModule
from vllm_kv_astpatch import _hybrid, plugin
from vllm_kv_astpatch._hybrid import HybridPatch, PatchSkipped


def test_entry_point_is_declared() -> None:
    try:
        dist = importlib.metadata.distribution("vllm-kv-astpatch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("package not installed (run through nox)")
    points = [ep for ep in dist.entry_points if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in points] == [
        ("kv_astpatch", "vllm_kv_astpatch.plugin:apply")
    ]
    assert points[0].load() is plugin.apply


def use(monkeypatch: pytest.MonkeyPatch, module: object, version: str = "0.22.1") -> HybridPatch:
    patch = HybridPatch(module.__name__, version_of=lambda: version)  # type: ignore[attr-defined]
    monkeypatch.setattr(_hybrid, "DEFAULT", patch)
    return patch


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "vllm.plugins.vllm_kv_astpatch"
    ]


def test_apply_logs_one_line_and_is_idempotent(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mod = make_module(SCHEDULER_0_22)
    use(monkeypatch, mod)
    caplog.set_level(logging.DEBUG, logger="vllm.plugins.vllm_kv_astpatch")
    plugin.apply()
    plugin.apply()
    logged = lines(caplog)
    assert len(logged) == 2  # one line per call
    assert logged[0][0] == logging.INFO
    assert logged[0][1].startswith("vllm-kv-astpatch: applied (vLLM 0.22.1, ")
    assert "already applied" in logged[1][1]
    assert mod.Scheduler().schedule(32, True) == ("load", 0)


def test_not_needed_logs_info(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use(monkeypatch, make_module(SCHEDULER_0_23), "0.33.0")
    caplog.set_level(logging.INFO, logger="vllm.plugins.vllm_kv_astpatch")
    plugin.apply()
    assert lines(caplog) == [
        (
            logging.INFO,
            f"vllm-kv-astpatch: not-needed (vLLM 0.33.0, {_hybrid.DEFAULT.split}): "
            "no external-connector assert in the split",
        )
    ]


def test_disabled_by_environment(
    make_module: MakeModule, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mod = make_module(SCHEDULER_0_22)
    use(monkeypatch, mod)
    monkeypatch.setenv("VLLM_KV_ASTPATCH_DISABLE", "1")
    caplog.set_level(logging.INFO, logger="vllm.plugins.vllm_kv_astpatch")
    plugin.apply()
    [(level, message)] = lines(caplog)
    assert level == logging.WARNING
    assert "skipped-disabled" in message
    assert "VLLM_KV_ASTPATCH_DISABLE" in message
    with pytest.raises(AssertionError):
        mod.Scheduler().schedule(32, False)


def test_without_vllm_it_warns_and_returns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_hybrid, "DEFAULT", HybridPatch("no_such_vllm.v1.core.sched.scheduler"))
    caplog.set_level(logging.INFO, logger="vllm.plugins.vllm_kv_astpatch")
    with pytest.warns(PatchSkipped, match="skipped-import-error"):
        plugin.apply()
    [(level, message)] = lines(caplog)
    assert level == logging.WARNING
    assert "skipped-import-error (vLLM unknown" in message
