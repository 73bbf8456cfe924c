"""The per-request cache controls memkv-vllm reads itself.

vLLM's OffloadingConnector, which memkv-vllm runs under, already reads
`max_offload_tokens`, `max_load_tokens` and (for tiers) `kv_load_tiers` from a request's
`kv_transfer_params`. This module adds what it leaves to the manager: `kv_load_tiers` in
direct mode (MemKV is medium `STORAGE`, locality `REMOTE`), and the retention hint
`offload_priority` (`"high"`, `"normal"`, `"low"`): a `low` request's blocks are never
written to the shared store. The servers decide evictions, so `high` changes nothing
there. A value outside those three is logged (key, value, accepted values) and the
request's blocks are not stored, as vllm-marconi-offload does: an instruction we could
not read must not leave its prompt behind.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_kv_identity.vocabulary import (
    OFFLOAD_PRIORITIES,
    OFFLOAD_PRIORITY,
    offload_priority_error,
)

from . import _compat as c

__all__ = ["loads_from_shared_store", "stores_to_shared_store"]

log = logging.getLogger("vllm.memkv_vllm")


class _Stores:
    """A request's parsed answer, kept on its `ReqContext` (vLLM >= 0.27.1)."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed


def stores_to_shared_store(req_context: Any) -> bool:
    """Whether the request lets its blocks be written to the shared store."""
    get_state = getattr(req_context, "get_state", None)
    cached = get_state(_Stores) if get_state is not None else None
    if cached is not None:
        return bool(cached.allowed)
    params = getattr(req_context, "kv_transfer_params", None) or {}
    value = params.get(OFFLOAD_PRIORITY, "normal")
    allowed = value in ("normal", "high")
    if value not in OFFLOAD_PRIORITIES:
        log.warning(
            "memkv-vllm: request %s: %s: its blocks are not stored",
            getattr(req_context, "req_id", "?"), offload_priority_error(value),
        )  # fmt: skip
    set_state = getattr(req_context, "set_state", None)
    if set_state is not None:
        set_state(_Stores(allowed))
    return allowed


def loads_from_shared_store(req_context: Any) -> bool:
    """Whether the request's `kv_load_tiers` let it load from the shared store."""
    tiers = getattr(req_context, "load_tier_filter", None)
    return tiers is None or bool(tiers.allows(c.MEDIUM_STORAGE, c.LOCALITY_REMOTE))
