"""MemKV for vLLM's native KV offloading: a `"memkv"` secondary tier for
`TieringOffloadingSpec` and the direct `MemKVOffloadingSpec` (`memkv_vllm.spec`).

`register` is the `vllm.general_plugins` entry point `memkv_tier`; vLLM calls it in
every process. Importing this package does not import vLLM.
"""

from __future__ import annotations

import logging
import os

from ._version import SUPPORTED_VLLM, __version__

__all__ = ["ENTRY_POINT", "SUPPORTED_VLLM", "TIER_TYPE", "__version__", "register"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
ENTRY_POINT = "memkv_tier"
TIER_TYPE = "memkv"
_registered = False


def register() -> None:
    """Register the `"memkv"` secondary tier type with vLLM (idempotent).

    Does nothing when `VLLM_PLUGINS` is set and does not name `memkv_tier`; warns when the
    running vLLM is outside `SUPPORTED_VLLM`.
    """
    global _registered
    if _registered:
        return
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and ENTRY_POINT not in [p.strip() for p in allowed.split(",")]:
        log.debug("memkv-vllm: not registering (VLLM_PLUGINS=%r)", allowed)
        return
    try:
        from . import _compat as c
    except ImportError as exc:  # a vLLM older than SUPPORTED_VLLM: no offloading tiers
        log.warning("memkv-vllm: this vLLM has no offloading tiers (%s); tier not registered", exc)
        return
    unsupported = c.unsupported_version()
    if unsupported:
        log.warning(unsupported)
    c.register_tier(TIER_TYPE, "memkv_vllm.tier", "MemKVTierManager")
    from .early_check import install

    install(TIER_TYPE)  # bad settings: one line where the program builds vLLM's config
    _registered = True
