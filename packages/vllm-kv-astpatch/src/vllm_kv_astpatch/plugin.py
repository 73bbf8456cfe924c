"""The `vllm.general_plugins` entry point: vLLM calls `apply` once per process."""

from __future__ import annotations

import logging

from ._hybrid import SKIPPED, apply_hybrid_patch

logger = logging.getLogger("vllm.plugins.vllm_kv_astpatch")
"""A child of vLLM's `vllm` logger, so the line lands in vLLM's own log output."""


def apply() -> None:
    """Apply the hybrid-model patch (unless disabled) and log one line saying what happened."""
    report = apply_hybrid_patch()
    level = logging.WARNING if report.status.startswith(SKIPPED) else logging.INFO
    logger.log(
        level,
        "vllm-kv-astpatch: %s (vLLM %s, %s): %s",
        report.status,
        report.vllm_version or "unknown",
        report.target,
        report.reason,
    )
