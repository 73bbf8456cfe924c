"""Validated settings of both modes: the tier entry and the direct spec's extra_config keys.

Each config is a frozen dataclass built by `from_dict`, which rejects unknown keys and
bad values with a `ConfigError` naming the key, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import ConfigError
from .store.settings import store_keys

__all__ = ["ConfigError", "DirectConfig", "TierConfig"]


def _coerce(where: str, key: str, value: Any, kind: type, minimum: float | None) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, key, f"got {value!r}; accepted: true or false")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(where, key, f"got {value!r}; accepted: a string")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(where, key, f"got {value!r}; accepted: a number")
    if kind is int and not float(value).is_integer():
        raise ConfigError(where, key, f"got {value!r}; accepted: an integer")
    out = int(value) if kind is int else float(value)
    if minimum is not None and out < minimum:
        raise ConfigError(where, key, f"got {value!r}; accepted: >= {minimum:g}")
    return out


def _build(cls: Any, where: str, data: Mapping[str, Any], ignore: frozenset[str]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    known = set(fields) | ignore
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            where, unknown[0], f"unknown key; accepted keys: {', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            continue
        kind = {"int": int, "float": float, "bool": bool, "str": str}[str(f.type)]
        values[name] = _coerce(where, name, data[name], kind, cls.MINIMUMS.get(name))
    return cls(**values)


@dataclass(frozen=True)
class TierConfig:
    """Keys of a `{"type": "memkv", ...}` entry in `secondary_tiers`.

    The store keys (`backend`, `mooncake_*`) are `.store.StoreConfig`'s;
    MemKV connection settings come from `MEMKV_CONFIG` / `MEMKV_*`.
    """

    prefix: str = "memkv-vllm"
    """Root of the key namespace (the FileMapper `root_dir`)."""
    n_read_threads: int = 8
    """Threads running loads (MemKV -> CPU pool)."""
    n_write_threads: int = 8
    """Threads running stores (CPU pool -> MemKV)."""
    blocks_per_op: int = 8
    """Blocks per batched `batch_put_views` / `batch_get_into` call."""
    max_store_backlog_mb: int = 2048
    """Queued store bytes above which new store jobs are shed (an empty backlog always
    admits one job)."""
    lookup_timeout_s: float = 5.0
    """An `exists` round that has not answered after this long resolves as MISS; never
    longer than the store's `stall_budget_s`, which bounds every call."""
    lookup_hit_ttl_s: float = 30.0
    """How long a lookup answer of 'present' is reused without asking again."""
    lookup_miss_ttl_s: float = 1.0
    """How long a lookup answer of 'absent' is reused without asking again."""
    load_failure_ttl_s: float = 60.0
    """After a failed load, the key reads as absent for this long (vLLM recomputes)."""
    probe_servers: bool = True
    """At startup, ask every configured server directly and fail if one does not answer."""

    MINIMUMS: ClassVar[dict[str, float]] = {
        "n_read_threads": 1,
        "n_write_threads": 1,
        "blocks_per_op": 1,
        "max_store_backlog_mb": 0,
        "lookup_timeout_s": 0.01,
        "lookup_hit_ttl_s": 0,
        "lookup_miss_ttl_s": 0,
        "load_failure_ttl_s": 0,
    }
    # keys vLLM itself puts in a tier entry (the factory pops type/module_path/backpressure)
    VLLM_KEYS: ClassVar[frozenset[str]] = frozenset({"locality", "type", "module_path"})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierConfig:
        """Validate a tier entry; raises `ConfigError` naming the offending key."""
        ignore = cls.VLLM_KEYS | store_keys("")
        cfg: TierConfig = _build(cls, "secondary_tiers[memkv]", data, ignore)
        if not cfg.prefix or cfg.prefix.startswith("/"):
            raise ConfigError(
                "secondary_tiers[memkv]", "prefix", f"got {cfg.prefix!r}; accepted: a "
                "non-empty relative name such as 'memkv-vllm'"
            )  # fmt: skip
        return cfg


SCRATCH_MEDIA = ("auto", "host", "gpu")


@dataclass(frozen=True)
class DirectConfig:
    """The `memkv_*` keys of `kv_connector_extra_config` for `MemKVOffloadingSpec`."""

    memkv_scratch_medium: str = "auto"
    """Where each rank gathers blocks before they move: auto | host | gpu."""
    memkv_num_threads: int = 4
    """Transfer threads per worker (each owns one scratch area)."""
    memkv_scratch_mb_per_thread: int = 128
    """Scratch bytes per thread; bounds the blocks moved per batched call (at most 64)."""
    memkv_wait_timeout_s: float = 120.0
    """Backstop for a `wait()` on transfers: each store call in a job already ends within
    `memkv_stall_budget_s` (plus its bytes at `MIN_TRANSFER_RATE`), and a member that
    missed it is skipped, so a wait ends about one budget after a member stops."""
    memkv_lookup_hit_ttl: float = 30.0
    """Seconds a 'present' lookup answer is reused."""
    memkv_lookup_miss_ttl: float = 1.0
    """Seconds an 'absent' lookup answer is reused."""
    memkv_lookup_timeout_s: float = 5.0
    """An `exists` round that has not answered after this long resolves as MISS; never
    longer than `memkv_stall_budget_s`."""
    memkv_spec_prefix: str = ""
    """Extra namespace folded into the key digest (separates deployments)."""
    memkv_publish_timeout_s: float = 60.0
    """How long the scheduler waits for every worker's published key prefix."""

    MINIMUMS: ClassVar[dict[str, float]] = {
        "memkv_num_threads": 1,
        "memkv_scratch_mb_per_thread": 1,
        "memkv_wait_timeout_s": 0.1,
        "memkv_lookup_hit_ttl": 0,
        "memkv_lookup_miss_ttl": 0,
        "memkv_lookup_timeout_s": 0.01,
        "memkv_publish_timeout_s": 0.1,
    }

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> DirectConfig:
        """Pick and validate the `memkv_*` keys (other keys belong to vLLM)."""
        store = store_keys("memkv_")
        ours = {k: v for k, v in extra.items() if k.startswith("memkv_") and k not in store}
        cfg: DirectConfig = _build(cls, "kv_connector_extra_config", ours, frozenset())
        if cfg.memkv_scratch_medium not in SCRATCH_MEDIA:
            raise ConfigError(
                "kv_connector_extra_config", "memkv_scratch_medium",
                f"got {cfg.memkv_scratch_medium!r}; accepted: {', '.join(SCRATCH_MEDIA)}",
            )  # fmt: skip
        return cfg
