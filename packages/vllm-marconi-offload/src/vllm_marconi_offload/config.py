"""The connector's configuration: `kv_connector_extra_config`, validated once.

Every key of the seed contract is accepted; any other key is an error (a typo must not
silently fall back to a default). Errors name the key and the accepted values.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kvpool_mmap
from kv_eviction import validate_policy
from kvpool_mmap import (
    DIRECT_IO_MODES,
    FSYNC_MODES,
    L1_OVERFLOW_MODES,
    MAX_IO_THREADS,
    MAX_TIER_BYTES,
    L1Overflow,
)
from pydantic import ByteSize, TypeAdapter, ValidationError

from .log import logger

DEFAULT_CPU_BYTES = 8 << 30
DEFAULT_EVICTION_POLICY = "auto"
LOAD_MODES = ("async", "same_step", "layer_wise")
EVICTION_ALIASES = {"eviction_decay": "decay", "eviction_reuse_mode": "reuse_mode"}
"""The seed's flat keys: aliases of the `marconi` policy's options in `eviction_options`
(with another policy they are ignored, with a warning: `ignored_keys`)."""


class ConfigError(ValueError):
    """A `kv_connector_extra_config` value is invalid; the message names the key."""


POOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_BYTE_SIZE = TypeAdapter(ByteSize)
_BARE_UNIT = re.compile(r"^\s*[0-9.]+\s*[kmgtpe]\s*$", re.IGNORECASE)


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
    # A full L1 in front of a slower L2: "demote" (the seed's design) refuses new blocks
    # until the victims' L2 writes land and leaves recomputed L2 hits in L2 only;
    # "drop_unwritten" makes L1 work as it would alone: it keeps storing new blocks, drops
    # the oldest ones not yet written to L2, and stores recomputed L2 hits into L1 again.
    l1_overflow: L1Overflow = "demote"
    # When a hit's blocks reach the GPU: "same_step" (it is scheduled at once and the step's
    # forward waits for the load on the GPU), "layer_wise" (as same_step, but on CUDA each
    # attention layer vLLM runs eagerly waits only for its own layer's load) or "async" (a
    # request waits, out of the batch, until its load has landed).
    load_mode: str = "layer_wise"
    # Log a `[CPU-OFFLOAD HIT]` line every this many finished lookups.
    hit_log_interval: int = 10
    # Read bandwidth (bytes/s) assumed for L2 until measured; used to decide whether an
    # L2 hit is cheaper to load than to recompute.
    l2_read_bytes_per_s: float = 1.5e9
    # Prefill throughput (tokens/s) assumed until measured; see `l2_read_bytes_per_s`.
    prefill_tokens_per_s: float = 0.0
    pool_name: str | None = None
    # kvpool-mmap's storage knobs (see its README).
    l2_fsync: str = "batch"
    direct_io: str = "auto"
    io_threads: int = 4
    verify_on_open: bool = False
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
        l2_bytes = _bytes(extra, "l2_bytes_to_use", 0, minimum=0)
        if l2_pool_path is None and l2_bytes:
            raise ConfigError("l2_bytes_to_use is set but l2_pool_path is not; set both or neither")
        if l2_pool_path is not None and not l2_bytes:
            raise ConfigError("l2_pool_path is set: l2_bytes_to_use must be a positive byte count")
        policy, options = _eviction(extra)
        config = cls(
            cpu_pool_path=cpu_pool_path,
            cpu_bytes_to_use=_bytes(extra, "cpu_bytes_to_use", DEFAULT_CPU_BYTES, minimum=1),
            l2_pool_path=l2_pool_path,
            l2_bytes_to_use=l2_bytes,
            eviction_policy=policy,
            eviction_options=options,
            admission_threshold=_int(extra, "admission_threshold", 1, minimum=1),
            l1_overflow=cast(
                L1Overflow, _choice(extra, "l1_overflow", "demote", L1_OVERFLOW_MODES)
            ),
            load_mode=_choice(extra, "load_mode", "layer_wise", LOAD_MODES),
            hit_log_interval=_int(extra, "hit_log_interval", 10, minimum=1),
            l2_read_bytes_per_s=_float(extra, "l2_read_bytes_per_s", 1.5e9, minimum=1.0),
            prefill_tokens_per_s=_float(extra, "prefill_tokens_per_s", 0.0, minimum=0.0),
            pool_name=_pool_name(extra),
            l2_fsync=_choice(extra, "l2_fsync", "batch", FSYNC_MODES),
            direct_io=_choice(extra, "direct_io", "auto", DIRECT_IO_MODES),
            io_threads=_int(extra, "io_threads", 4, minimum=1, maximum=MAX_IO_THREADS),
            verify_on_open=_bool(extra, "verify_on_open", False),
            extra=extra,
        )
        config.warn_ignored_keys()
        return config

    def ignored_keys(self) -> list[str]:
        """Keys the user set that this configuration does not use."""
        ignored = []
        if self.eviction_policy != "marconi":
            ignored += [k for k in _MARCONI_KEYS if k in self.extra]
        if not self.has_l2:
            ignored += [k for k in _L2_KEYS if k in self.extra]
        return ignored

    def warn_ignored_keys(self) -> None:
        """Log a warning for every key that has no effect here (a misunderstanding the
        user should hear about, not an error)."""
        for key in self.ignored_keys():
            reason = (
                f"eviction_policy={self.eviction_policy!r} takes no Marconi options"
                if key in _MARCONI_KEYS
                else "there is no L2 (l2_pool_path is not set)"
            )
            logger.warning("kv_connector_extra_config: %s is ignored: %s", key, reason)


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
        "l1_overflow",
        "load_mode",
        "hit_log_interval",
        "l2_read_bytes_per_s",
        "prefill_tokens_per_s",
        "pool_name",
        "l2_fsync",
        "direct_io",
        "io_threads",
        "verify_on_open",
    }
)
_MARCONI_KEYS = ("eviction_decay", "eviction_reuse_mode")
_L2_KEYS = ("l2_fsync", "direct_io", "verify_on_open", "l2_read_bytes_per_s", "l1_overflow")

# kvpool-mmap's names of the settings users give under the keys above.
_KVPOOL_SETTING_KEYS = {
    "l1.bytes_to_use": "cpu_bytes_to_use",
    "l1.path": "cpu_pool_path",
    "l2.bytes_to_use": "l2_bytes_to_use",
    "l2.path": "l2_pool_path",
    "engine_id": "pool_name",
}
_KVPOOL_SETTING = re.compile(
    r"(?<![\w.])(" + "|".join(re.escape(k) for k in _KVPOOL_SETTING_KEYS) + r")(?![\w])"
)


def in_user_terms(text: str) -> str:
    """`text` with kvpool-mmap's setting names replaced by the user's keys."""
    return _KVPOOL_SETTING.sub(lambda m: _KVPOOL_SETTING_KEYS[m.group(1)], text)


@contextlib.contextmanager
def user_keys() -> Iterator[None]:
    """Re-raise kvpool-mmap errors (same type) with the user's key names in the message,
    e.g. `cpu_bytes_to_use` where kvpool-mmap says `l1.bytes_to_use`."""
    try:
        yield
    except kvpool_mmap.KvPoolError as exc:
        message = in_user_terms(
            exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        )
        if isinstance(exc, OSError) and exc.errno is not None:
            raise type(exc)(exc.errno, message) from exc
        raise type(exc)(message) from exc


def _int(
    extra: Mapping[str, Any], key: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    value = extra.get(key, default)
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    wrong = ConfigError(f"{key} must be an integer {bound}, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise wrong
    try:
        number = int(value)
    except (ValueError, OverflowError):  # "x", NaN, inf
        raise wrong from None
    if isinstance(value, float) and number != value:
        raise wrong
    if number < minimum or (maximum is not None and number > maximum):
        raise wrong
    return number


def _bytes(extra: Mapping[str, Any], key: str, default: int, *, minimum: int) -> int:
    """A byte count: an integer, or a size string such as "8GiB" (2^30 units) or "8GB"
    (10^9 units), at most MAX_TIER_BYTES."""
    value = extra.get(key, default)
    accepted = (
        f"{key} must be a byte count in [{minimum}, 2^60] such as 8GiB, 512MiB, 8GB or "
        f"8589934592, got {value!r}"
    )
    if isinstance(value, str) and not value.strip().isdigit():
        if _BARE_UNIT.match(value):
            raise ConfigError(f"{accepted}: write GiB (2^30) or GB (10^9), not a bare unit")
        try:
            value = int(_BYTE_SIZE.validate_python(value))
        except ValidationError:
            raise ConfigError(accepted) from None
    try:
        return _int({key: value}, key, default, minimum=minimum, maximum=MAX_TIER_BYTES)
    except ConfigError:
        raise ConfigError(accepted) from None


def _bool(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    value = extra.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


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
    """`eviction_policy` and its options (marconi's flat aliases folded in), checked by
    kv-eviction.

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
        if key not in extra or policy != "marconi":
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


def _choice(extra: Mapping[str, Any], key: str, default: str, accepted: tuple[str, ...]) -> str:
    value = extra.get(key, default)
    if value not in accepted:
        raise ConfigError(f"{key} must be one of {list(accepted)}, got {value!r}")
    return str(value)


def _optional_path(extra: Mapping[str, Any], key: str) -> str | None:
    value = extra.get(key)
    if value is None:
        return None
    try:
        return kvpool_mmap.check_pool_path(value, key)
    except kvpool_mmap.ConfigError as exc:
        raise ConfigError(str(exc)) from None


def _pool_name(extra: Mapping[str, Any]) -> str | None:
    value = extra.get("pool_name")
    if value is None:
        return None
    if not isinstance(value, str) or not POOL_NAME.match(value):
        raise ConfigError(
            f"pool_name must be 1-64 characters of A-Z a-z 0-9 _ . - (it names the pool "
            f"files as it is), got {value!r}"
        )
    return value
