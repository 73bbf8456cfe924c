"""The connector's configuration: `kv_connector_extra_config`, validated once.

Every key of the seed contract is accepted; any other key is an error (a typo must not
silently fall back to a default). Errors name the key and the accepted values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kv_eviction import validate_policy

DEFAULT_CPU_BYTES = 8 << 30
DEFAULT_EVICTION_POLICY = "auto"
EVICTION_ALIASES = {"eviction_decay": "decay", "eviction_reuse_mode": "reuse_mode"}
"""The seed's flat keys: aliases of the `marconi` policy's options in `eviction_options`."""


class ConfigError(ValueError):
    """A `kv_connector_extra_config` value is invalid; the message names the key."""


@dataclass(frozen=True)
class OffloadConfig:
    """Validated connector settings.

    `cpu_bytes_to_use` and `l2_bytes_to_use` are totals for the server; the store divides
    them by data-parallel size and tensor-parallel size.
    """

    cpu_pool_path: str | None = None
    cpu_bytes_to_use: int = DEFAULT_CPU_BYTES
    l2_pool_path: str | None = None
    l2_bytes_to_use: int = 0
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    eviction_options: Mapping[str, Any] = field(default_factory=dict)
    """Options of `eviction_policy`, the flat aliases folded in; kv-eviction validated both."""
    admission_threshold: int = 1
    # Log a `[CPU-OFFLOAD HIT]` line every this many finished lookups.
    hit_log_interval: int = 10
    # Read bandwidth (bytes/s) assumed for L2 until measured; used to decide whether an
    # L2 hit is cheaper to load than to recompute.
    l2_read_bytes_per_s: float = 1.5e9
    # Prefill throughput (tokens/s) assumed until measured; see `l2_read_bytes_per_s`.
    prefill_tokens_per_s: float = 0.0
    pool_name: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def has_l2(self) -> bool:
        return self.l2_pool_path is not None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> OffloadConfig:
        """Validate `kv_connector_extra_config` and build the settings."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - _KNOWN_KEYS)
        if unknown:
            raise ConfigError(
                f"kv_connector_extra_config: unknown key(s) {unknown}; "
                f"accepted keys: {sorted(_KNOWN_KEYS)}"
            )
        cpu_pool_path = _optional_path(extra, "cpu_pool_path")
        l2_pool_path = _optional_path(extra, "l2_pool_path")
        l2_bytes = _int(extra, "l2_bytes_to_use", 0, minimum=0)
        if l2_pool_path is None and l2_bytes:
            raise ConfigError("l2_bytes_to_use is set but l2_pool_path is not; set both or neither")
        if l2_pool_path is not None and not l2_bytes:
            raise ConfigError("l2_pool_path is set: l2_bytes_to_use must be a positive byte count")
        policy, options = _eviction(extra)
        return cls(
            cpu_pool_path=cpu_pool_path,
            cpu_bytes_to_use=_int(extra, "cpu_bytes_to_use", DEFAULT_CPU_BYTES, minimum=1),
            l2_pool_path=l2_pool_path,
            l2_bytes_to_use=l2_bytes,
            eviction_policy=policy,
            eviction_options=options,
            admission_threshold=_int(extra, "admission_threshold", 1, minimum=1),
            hit_log_interval=_int(extra, "hit_log_interval", 10, minimum=1),
            l2_read_bytes_per_s=_float(extra, "l2_read_bytes_per_s", 1.5e9, minimum=1.0),
            prefill_tokens_per_s=_float(extra, "prefill_tokens_per_s", 0.0, minimum=0.0),
            pool_name=_optional_str(extra, "pool_name"),
            extra=extra,
        )


_KNOWN_KEYS = frozenset(
    {
        "cpu_pool_path",
        "cpu_bytes_to_use",
        "l2_pool_path",
        "l2_bytes_to_use",
        "eviction_policy",
        "eviction_options",
        "eviction_decay",
        "eviction_reuse_mode",
        "admission_threshold",
        "hit_log_interval",
        "l2_read_bytes_per_s",
        "prefill_tokens_per_s",
        "pool_name",
    }
)


def _int(extra: Mapping[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}") from None
    if isinstance(value, float) and number != value:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    if number < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return number


def _float(extra: Mapping[str, Any], key: str, default: float, *, minimum: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key} must be a number >= {minimum}, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key} must be a number >= {minimum}, got {value!r}") from None
    if not math.isfinite(number) or number < minimum:
        raise ConfigError(f"{key} must be a finite number >= {minimum}, got {value!r}")
    return number


def _eviction(extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """`eviction_policy` and its options (flat aliases folded in), checked by kv-eviction.

    kv-eviction's registry is the one list of policies and options: a policy registered
    there (`kv_eviction.register_policy`) is configurable here without an edit.
    """
    policy = extra.get("eviction_policy", DEFAULT_EVICTION_POLICY)
    raw = extra.get("eviction_options", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"eviction_options must be a mapping of option names, got {raw!r}")
    options = dict(raw)
    keys = ["eviction_policy", *(["eviction_options"] if "eviction_options" in extra else [])]
    for key, option in EVICTION_ALIASES.items():
        if key not in extra:
            continue
        if option in options:
            raise ConfigError(f"{key} and eviction_options[{option!r}] both set; set one")
        options[option] = extra[key]
        keys.append(key)
    try:
        validate_policy(policy, options)
    except ValueError as exc:
        raise ConfigError(f"{' / '.join(keys)}: {exc}") from None
    return str(policy), options


def _optional_str(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _optional_path(extra: Mapping[str, Any], key: str) -> str | None:
    value = _optional_str(extra, key)
    if value is not None and "\x00" in value:
        raise ConfigError(f"{key} must be a directory path, got {value!r}")
    return value
