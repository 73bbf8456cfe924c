"""`vllm_marconi_offload.PATCH_STATUS`, as the README's *Hybrid models* shows it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_patch_status_is_not_needed_on_a_supported_vllm() -> None:
    """On a supported release the connector patches nothing."""
    import vllm_marconi_offload

    assert vllm_marconi_offload.PATCH_STATUS == "not-needed"


def test_the_scheduler_indeed_needs_no_patch() -> None:
    """vLLM's scheduler has no external-connector assert (vllm-kv-astpatch reads the live
    method), which is why the status says "not-needed"."""
    astpatch = pytest.importorskip("vllm_kv_astpatch")
    assert astpatch.apply_hybrid_patch().status == "not-needed"
