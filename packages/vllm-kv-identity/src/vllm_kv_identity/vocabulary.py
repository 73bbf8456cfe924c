"""The words both plugins and their clients share with vLLM: per-request cache controls
in `kv_transfer_params`, tier media and localities, and the latency buckets of their
metrics. One spelling each; no vLLM import.
"""

from __future__ import annotations

__all__ = [
    "KV_LOAD_TIERS",
    "LATENCY_BUCKETS",
    "LOCAL",
    "LOCALITIES",
    "MAX_LOAD_TOKENS",
    "MAX_OFFLOAD_TOKENS",
    "MEDIA",
    "MEDIUM_CPU",
    "MEDIUM_STORAGE",
    "OFFLOAD_PRIORITIES",
    "OFFLOAD_PRIORITY",
    "REMOTE",
    "offload_priority_error",
]

MAX_OFFLOAD_TOKENS = "max_offload_tokens"
"""`kv_transfer_params` key (vLLM's own): store at most the request's first N tokens."""
MAX_LOAD_TOKENS = "max_load_tokens"
"""`kv_transfer_params` key (vLLM's own): load at most N tokens beyond vLLM's own hit."""
KV_LOAD_TIERS = "kv_load_tiers"
"""`kv_transfer_params` key (vLLM's own): load only from tiers a `{medium, locality}`
entry matches."""
OFFLOAD_PRIORITY = "offload_priority"
"""`kv_transfer_params` key (ours): how long the request's blocks stay."""
OFFLOAD_PRIORITIES = ("low", "normal", "high")
"""The values of `offload_priority`; `normal` when it is absent."""

MEDIUM_CPU = "CPU"
"""Host memory (the connector's L1), as `kv_load_tiers` and KV events name it."""
MEDIUM_STORAGE = "STORAGE"
"""Disk or a shared store (the connector's L2, memkv-vllm's store)."""
MEDIA = (MEDIUM_CPU, MEDIUM_STORAGE)
LOCAL = "LOCAL"
"""A tier on this host."""
REMOTE = "REMOTE"
"""A tier other hosts share."""
LOCALITIES = (LOCAL, REMOTE)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of every latency histogram either plugin exports."""


def offload_priority_error(value: object) -> str:
    """The one-line error for an `offload_priority` that is none of `OFFLOAD_PRIORITIES`."""
    accepted = ", ".join(OFFLOAD_PRIORITIES)
    return f"kv_transfer_params[{OFFLOAD_PRIORITY!r}] must be one of {accepted}; got {value!r}"
