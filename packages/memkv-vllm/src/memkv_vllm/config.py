"""Validated settings of both modes: the tier entry and the direct spec's extra_config keys.

Each setting is declared once, with `kv_offload_settings.setting` (kind, default, bounds,
doc); checks, error messages and the README tables come from the declarations. Each
config is a frozen dataclass built by `from_dict` / `from_extra_config`, which reject
unknown keys (naming the nearest accepted one) and bad values with a `ConfigError`
naming where the key was set, the key, the value and what is accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import kv_offload_settings
from kv_offload_settings import Setting, expose, setting, settings_of, unknown_keys_message

from .errors import ConfigError
from .store.settings import store_keys

__all__ = ["DEPRECATED_DIRECT_KEYS", "ConfigError", "DirectConfig", "TierConfig"]

log = logging.getLogger("vllm.memkv_vllm")


def _build(cls: Any, where: str, data: Mapping[str, Any], others: frozenset[str]) -> Any:
    """`cls` from `data` (its declared settings; `others` are keys another part reads),
    or ConfigError naming `where`."""
    declared = settings_of(cls)
    unknown = sorted(set(data) - set(declared) - others)
    if unknown:
        raise ConfigError(where, "", unknown_keys_message(unknown, {*declared, *others}))
    values = {name: _checked(s, data[name], where) for name, s in declared.items() if name in data}
    return cls(**values)


def _checked(declared: Setting, value: Any, where: str) -> Any:
    try:
        return declared.check(value)
    except kv_offload_settings.ConfigError as exc:
        raise ConfigError(where, "", str(exc)) from None


@dataclass(frozen=True)
class TierConfig:
    """Keys of a `{"type": "memkv", ...}` entry in `secondary_tiers`.

    The store keys (`backend`, `stall_budget_s`, a backend's own) are `.store.StoreConfig`'s;
    MemKV connection settings come from `MEMKV_CONFIG` / `MEMKV_*`.
    """

    prefix: str = setting(
        "text",
        "Root of the key namespace (vLLM's `FileMapper` `root_dir`).",
        "memkv-vllm",
        accepts="a non-empty relative name such as 'memkv-vllm'",
    )
    n_read_threads: int = setting(
        "int",
        "Threads running loads (separate from stores: a store backlog never delays a load).",
        8,
    )
    n_write_threads: int = setting("int", "Threads running stores.", 8)
    blocks_per_op: int = setting(
        "int", "Chunks per batched `batch_put_views` / `batch_get_into` call.", 8
    )
    max_store_backlog_mb: int = setting(
        "int",
        "Queued store MiB above which new store jobs are shed (an empty backlog always "
        "admits one job).",
        2048,
        minimum=0,
    )
    lookup_timeout_s: float = setting(
        "number",
        "An `exists` round still unanswered after this long resolves as absent (recompute); "
        "never longer than the store's `stall_budget_s` (see *Store backends*), so 1 s by "
        "default.",
        5.0,
        minimum=0.01,
    )
    lookup_hit_ttl_s: float = setting(
        "number",
        "Seconds a lookup answer of 'present' is reused without asking again.",
        30.0,
        minimum=0,
    )
    lookup_miss_ttl_s: float = setting(
        "number",
        "Seconds a lookup answer of 'absent' is reused without asking again.",
        1.0,
        minimum=0,
    )
    load_failure_ttl_s: float = setting(
        "number",
        "After a failed load, the chunk reads as absent this long (vLLM recomputes it).",
        60.0,
        minimum=0,
    )
    probe_servers: bool = setting(
        "bool",
        "At startup, ask every configured server directly and fail naming the one that "
        "does not answer.",
        True,
    )

    # keys vLLM itself puts in a tier entry (the factory pops type/module_path/backpressure)
    VLLM_KEYS: ClassVar[frozenset[str]] = frozenset({"locality", "type", "module_path"})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierConfig:
        """Validate a tier entry; raises `ConfigError` naming the offending key."""
        others = cls.VLLM_KEYS | store_keys("")
        cfg: TierConfig = _build(cls, "secondary_tiers[memkv]", data, others)
        if not cfg.prefix or cfg.prefix.startswith("/"):
            declared = settings_of(cls)["prefix"]
            raise ConfigError(
                "secondary_tiers[memkv]", "", f"prefix must be {declared.accepted()}, "
                f"got {cfg.prefix!r}"
            )  # fmt: skip
        return cfg


SCRATCH_MEDIA = ("auto", "host", "gpu")
_TIER = settings_of(TierConfig)
DEPRECATED_DIRECT_KEYS = {
    "memkv_lookup_hit_ttl": "memkv_lookup_hit_ttl_s",
    "memkv_lookup_miss_ttl": "memkv_lookup_miss_ttl_s",
}
"""Earlier spellings of direct-mode keys, still accepted with a warning."""


@dataclass(frozen=True)
class DirectConfig:
    """The `memkv_*` keys of `kv_connector_extra_config` for `MemKVOffloadingSpec`; the
    lookup settings are the tier's, with the `memkv_` prefix."""

    memkv_scratch_medium: str = setting(
        "choice",
        "Where each rank gathers blocks before they move (see below).",
        "auto",
        choices=SCRATCH_MEDIA,
    )
    memkv_num_threads: int = setting(
        "int",
        "Transfer threads per worker that move a job's parts (at most 64 blocks each) in "
        "parallel, each with its own scratch (page-locked on CUDA) and a 32 MiB GPU buffer.",
        4,
    )
    memkv_scratch_mb_per_thread: int = setting(
        "int", "Host scratch MiB per thread; bounds the blocks per part (at most 64).", 128
    )
    memkv_wait_timeout_s: float = setting(
        "number",
        "Backstop for a `wait()` on transfers: each store call in a job already ends within "
        "`memkv_stall_budget_s` (plus its bytes at 256 MiB/s), and a member that missed it "
        "is skipped, so a wait ends about one budget after a member stops.",
        120.0,
        minimum=0.1,
    )
    memkv_lookup_hit_ttl_s: float = expose(
        _TIER["lookup_hit_ttl_s"],
        doc=f"{_TIER['lookup_hit_ttl_s'].doc} (Formerly `memkv_lookup_hit_ttl`, still "
        "accepted with a warning.)",
    )
    memkv_lookup_miss_ttl_s: float = expose(
        _TIER["lookup_miss_ttl_s"],
        doc=f"{_TIER['lookup_miss_ttl_s'].doc} (Formerly `memkv_lookup_miss_ttl`, still "
        "accepted with a warning.)",
    )
    memkv_lookup_timeout_s: float = expose(
        _TIER["lookup_timeout_s"],
        doc="An `exists` round still unanswered after this long resolves as absent; never "
        "longer than `memkv_stall_budget_s`.",
    )
    memkv_spec_prefix: str = setting(
        "text",
        "Extra namespace folded into the key digest (separates deployments).",
        "",
        accepts="a string",
    )
    memkv_publish_timeout_s: float = setting(
        "number",
        "How long the scheduler waits for every worker's published key prefix (seconds).",
        60.0,
        minimum=0.1,
    )

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> DirectConfig:
        """Pick and validate the `memkv_*` keys (other keys belong to vLLM)."""
        store = store_keys("memkv_")
        ours = {k: v for k, v in extra.items() if k.startswith("memkv_") and k not in store}
        where = "kv_connector_extra_config"
        for old, new in DEPRECATED_DIRECT_KEYS.items():
            if old not in ours:
                continue
            if new in ours:
                raise ConfigError(where, "", f"{old} and {new} are both set; set {new} only")
            log.warning("memkv-vllm: %s: %s is now %s", where, old, new)
            ours[new] = ours.pop(old)
        cfg: DirectConfig = _build(cls, where, ours, store)
        return cfg


SETTINGS_TABLES: dict[str, Mapping[str, Setting]] = {
    "memkv-vllm-tier": _TIER,
    "memkv-vllm-direct": settings_of(DirectConfig),
}
"""The README's generated tables (`tools/settings_tables.py`) by marker name."""
