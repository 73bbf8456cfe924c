"""vllm-marconi-offload: two-tier (RAM + disk) CPU KV offload for vLLM with Marconi eviction.

Use it with::

    --kv-transfer-config '{"kv_connector": "MarconiOffloadConnector",
                           "kv_connector_module_path": "vllm_marconi_offload",
                           "kv_role": "kv_both", "kv_connector_extra_config": {...}}'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._version import SUPPORTED_VLLM, __version__
from .config import ConfigError, OffloadConfig

__all__ = [
    "PATCH_STATUS",
    "SUPPORTED_VLLM",
    "ConfigError",
    "MarconiOffloadConnector",
    "OffloadConfig",
    "__version__",
]

if TYPE_CHECKING:
    from .connector import MarconiOffloadConnector

    PATCH_STATUS: str

_RENAMED = {"SimpleCPUOffloadConnector": "MarconiOffloadConnector"}


def __getattr__(name: str) -> object:
    # The connector imports vLLM; loaded on first use, so the vLLM-free modules (config,
    # spec, scheduler, stats, ...) import without it.
    if name == "MarconiOffloadConnector":
        from .connector import MarconiOffloadConnector

        return MarconiOffloadConnector
    if name == "PATCH_STATUS":
        return _patch_status()
    if name == "OffloadingConnector":  # vLLM's one-flag offload, plugins not loaded
        from .early_check import ONE_FLAG_ERROR

        raise ValueError(ONE_FLAG_ERROR)
    if name in _RENAMED:
        raise ValueError(
            f'"kv_connector": "{name}" with "kv_connector_module_path": '
            f'"vllm_marconi_offload" is no longer supported: vLLM ships a built-in connector '
            f'of that name and special-cases it. Use "kv_connector": "{_RENAMED[name]}".'
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _patch_status() -> str:
    """`PATCH_STATUS`: the state of the hybrid-model scheduler patch for the installed vLLM.

    "not-needed" on every release in `SUPPORTED_VLLM`: their hybrid-model scheduler takes
    external hits, so the connector patches nothing; "skipped-unsupported-vllm-VERSION"
    outside it (the connector patches nothing there either; vllm-kv-astpatch has the patch
    for vLLM 0.22.1). Imports vLLM.
    """
    from .compat import check_supported, vllm_version

    version = vllm_version()
    return (
        "not-needed" if check_supported(version) is None else f"skipped-unsupported-vllm-{version}"
    )
