"""Against an installed vLLM (skipped without one): run with a vLLM environment, e.g.
`PYTHONPATH=src <vllm-venv>/bin/python -m pytest tests/test_real_vllm.py`."""

from __future__ import annotations

import pytest
from vllm_kv_astpatch import _mechanism
from vllm_kv_astpatch._hybrid import HybridPatch, parse_version
from vllm_kv_astpatch._mechanism import FunctionTarget

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")
scheduler = pytest.importorskip("vllm.v1.core.sched.scheduler")


def no_change(node: object) -> int:
    return 0


@pytest.mark.parametrize("qualname", ["Scheduler._mamba_block_aligned_split", "Scheduler.schedule"])
def test_live_scheduler_source_verifies(qualname: str) -> None:
    """The whole-file recompile reproduces the live code objects exactly."""
    prepared = _mechanism.prepare(FunctionTarget(scheduler.__name__, qualname), no_change)
    assert prepared.patched is None
    assert prepared.function.__code__ is prepared.original


def test_patch_outcome_for_this_version() -> None:
    report = HybridPatch().apply()
    assert report.vllm_version == vllm.__version__
    parsed = parse_version(vllm.__version__)
    assert parsed is not None
    assert report.status == ("applied" if parsed < (0, 23, 0) else "not-needed")
