"""Narrow, verified, fail-closed in-memory AST patches of live vLLM methods.

The one patch today lets external KV connectors serve Mamba-hybrid models on vLLM
0.22.1 (see the README for what it guarantees on which vLLM). Connectors call
`apply_hybrid_patch` (or rely on the `vllm.general_plugins` entry point); where a
hit may end on such a model is `vllm_kv_identity.aligned_external_hit_tokens`.
"""

from __future__ import annotations

from ._hybrid import (
    DISABLE_ENV,
    SUPPORTED_VLLM,
    HybridPatch,
    PatchReport,
    PatchSkipped,
    apply_hybrid_patch,
    hybrid_external_hits_supported,
    patch_report,
    revert_hybrid_patch,
)
from ._version import __version__

__all__ = [
    "DISABLE_ENV",
    "PATCH_STATUS",
    "SUPPORTED_VLLM",
    "HybridPatch",
    "PatchReport",
    "PatchSkipped",
    "__version__",
    "apply_hybrid_patch",
    "hybrid_external_hits_supported",
    "patch_report",
    "revert_hybrid_patch",
]


def __getattr__(name: str) -> str:
    # PATCH_STATUS is computed on access, so `vllm_kv_astpatch.PATCH_STATUS` is never stale.
    if name == "PATCH_STATUS":
        return patch_report().status
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
