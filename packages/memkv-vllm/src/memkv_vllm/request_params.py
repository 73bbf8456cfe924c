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


def stores_to_shared_store(req_context: c.RequestOffloadingContext) -> bool:
    """Whether the request lets its blocks be written to the shared store."""
    cached = c.request_state(req_context, _Stores)
    if cached is not None:
        return cached.allowed
    value = c.request_transfer_params(req_context).get(OFFLOAD_PRIORITY, "normal")
    allowed = value in ("normal", "high")
    if value not in OFFLOAD_PRIORITIES:
        log.warning(
            "memkv-vllm: request %s: %s: its blocks are not stored",
            c.request_id(req_context), offload_priority_error(value),
        )  # fmt: skip
    c.keep_request_state(req_context, _Stores(allowed))
    return allowed


def loads_from_shared_store(req_context: c.RequestOffloadingContext) -> bool:
    """Whether the request's `kv_load_tiers` let it load from the shared store."""
    return c.loads_from_remote_storage(req_context)
