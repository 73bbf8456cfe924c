"""Client configuration and the one `MEMKV_CONFIG` / `MEMKV_*` loader.

One precedence rule, for memkv-client and for every plugin that reads the same file:

1. a value given in code (`Client(servers=...)`, `load_config(**overrides)`, or a
   plugin's own config such as a vLLM `kv_connector_extra_config` entry);
2. the key in the `MEMKV_CONFIG` YAML mapping;
3. the environment variable `MEMKV_<KEY>` (upper case; see `env_name`);
4. the default.

`ConfigSources.read` reads and parses `MEMKV_CONFIG` once; `ConfigSources.lookup`
applies steps 2-3 to any key, and `ConfigSources.client_config` builds the client's
validated `Config`. A bad value raises `memkv_client.errors.ConfigError` naming the
setting and where it came from. There is no licence check: a `license` entry is
accepted and ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kv_offload_settings
from kv_offload_settings import read_config_file, unknown_keys_message

from .auth import check_key, parse_key
from .errors import ConfigError
from .sockio import parse_address

__all__ = ["Config", "ConfigSources", "RawSetting", "Transport", "env_name", "load_config"]


class Transport(enum.Enum):
    """`auto` prefers RDMA and falls back to TCP; `rdma`/`rdma-rc` require RDMA."""

    AUTO = "auto"
    TCP = "tcp"
    RDMA = "rdma"
    RDMA_RC = "rdma-rc"


@dataclass(frozen=True)
class Config:
    """Validated client settings (defaults mirror the vendor client's)."""

    servers: tuple[str, ...] = ("127.0.0.1:9900",)
    """`host:port` of every server; keys are spread over them by HRW hashing."""
    rdma_devices: tuple[str, ...] = ("mlx5_0",)
    """RDMA device names the client may use (`MEMKV_RDMA_DEVICES`, comma-separated)."""
    bind_addresses: tuple[str | None, ...] = (None,)
    """Local addresses to bind outgoing connections to (`None` = any)."""
    cache_size_mb: int = 256
    """Accepted for compatibility; this client keeps no local value cache."""
    connect_timeout_ms: int = 5000
    """Deadline for TCP connect plus the HELLO exchange."""
    request_timeout_ms: int = 5000
    """Default deadline of a whole call (plus 1 s per 16 MiB of values it moves); a call's
    `timeout=` argument replaces it. A member that misses a deadline is skipped until a
    background probe succeeds."""
    probe_interval_ms: int = 500
    """Longest wait between background probes of a member that is down (they start at
    50 ms and double up to this)."""
    gid_index: int = 0
    traffic_class: int = 0
    service_level: int = 0
    pkey_index: int = 0
    mtu: int = 4096
    """RDMA path MTU: one of 256, 512, 1024, 2048, 4096."""
    rdma_timeout_secs: int = 10
    """Deadline for one RDMA completion."""
    num_connections: int = 8
    """Connections (and concurrent requests) per server."""
    license: str | None = None
    """Ignored: the open client has no licence check."""
    auth_key: bytes | None = field(default=None, repr=False)
    """32-byte shared HMAC key (64 hex digits, not all zero). `None`: on loopback, the
    per-user key file (`MEMKV_AUTH_KEY_FILE`, default `~/.config/memkv/auth.key`)."""
    transport: Transport = Transport.AUTO
    max_batch_size: int = 64
    """Items per request; larger batches are split and sent concurrently."""
    max_request_mb: int = 64
    """Value bytes per request; larger batches are split and sent concurrently."""
    staging_size_mb: int = 256
    """RDMA staging pool for unregistered buffers."""
    staging_slot_mb: int = 16


_ENV_NAMES: dict[str, str] = {
    "traffic_class": "MEMKV_RDMA_TRAFFIC_CLASS",
    "service_level": "MEMKV_RDMA_SERVICE_LEVEL",
    "pkey_index": "MEMKV_RDMA_PKEY_INDEX",
    "gid_index": "MEMKV_RDMA_GID_INDEX",
}
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_INT_RANGES: dict[str, tuple[int, int]] = {
    "cache_size_mb": (0, 1 << 20),
    "connect_timeout_ms": (1, 3_600_000),
    "request_timeout_ms": (1, 86_400_000),
    "probe_interval_ms": (10, 60_000),
    "gid_index": (0, 255),
    "traffic_class": (0, 255),
    "service_level": (0, 15),
    "pkey_index": (0, 65535),
    "rdma_timeout_secs": (1, 3600),
    "num_connections": (1, 256),
    "max_batch_size": (1, 1024),
    "max_request_mb": (1, 4096),
    "staging_size_mb": (1, 1 << 20),
    "staging_slot_mb": (1, 4096),
}
_MTUS = (256, 512, 1024, 2048, 4096)


def env_name(name: str) -> str:
    """The environment variable that sets `name`."""
    return _ENV_NAMES.get(name, "MEMKV_" + name.upper())


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"expected a list or a comma-separated string, got {type(value).__name__}")


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"expected an integer, got {value!r}")


def _convert(name: str, value: Any) -> Any:
    if name == "servers":
        servers = [str(s) for s in _as_list(value)]
        if not servers:
            raise ValueError("at least one server is required")
        for s in servers:
            parse_address(s)
        if len(set(servers)) != len(servers):
            raise ValueError("duplicate server addresses")
        return tuple(servers)
    if name == "rdma_devices":
        return tuple(str(d) for d in _as_list(value))
    if name == "bind_addresses":
        out = [None if a in (None, "", "none", "None") else str(a) for a in _as_list(value)]
        return tuple(out) or (None,)
    if name == "transport":
        try:
            return Transport(str(value).strip().lower())
        except ValueError:
            choices = ", ".join(t.value for t in Transport)
            raise ValueError(f"{value!r} is not one of {choices}") from None
    if name == "auth_key":
        if value is None:
            return None
        if isinstance(value, bytes):
            return check_key(value)
        return parse_key(str(value))
    if name == "license":
        return None if value is None else str(value)
    if name == "mtu":
        mtu = _as_int(value)
        if mtu not in _MTUS:
            raise ValueError(f"{mtu} is not one of {', '.join(map(str, _MTUS))}")
        return mtu
    lo, hi = _INT_RANGES[name]
    n = _as_int(value)
    if not lo <= n <= hi:
        raise ValueError(f"{n} is out of range {lo}..{hi}")
    return n


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        return read_config_file(path)
    except kv_offload_settings.ConfigError as exc:
        raise ConfigError("MEMKV_CONFIG", str(exc)) from None


@dataclass(frozen=True)
class RawSetting:
    """A value found by `ConfigSources.lookup`, not yet converted, and where it was."""

    value: Any
    where: str
    """`MEMKV_CONFIG <path>` or `environment`."""
    key: str
    """The key as written there: `servers` in the file, `MEMKV_SERVERS` in the environment."""
    in_file: bool
    """Whether it came from the `MEMKV_CONFIG` file."""


@dataclass(frozen=True)
class ConfigSources:
    """`MEMKV_CONFIG` (parsed once) and the environment, for the client and its plugins.

    Build it with `read`, then take every setting from it: `client_config` for the
    client's `Config`, `lookup` for a plugin's own keys. Immutable and thread-safe.
    """

    env: Mapping[str, str]
    path: str = ""
    """The `MEMKV_CONFIG` path; empty when unset."""
    file_values: Mapping[str, Any] = field(default_factory=dict)
    """Every key of the `MEMKV_CONFIG` mapping (the client's and the plugins')."""

    @classmethod
    def read(
        cls, env: Mapping[str, str] | None = None, *, plugin_keys: Iterable[str] = ()
    ) -> ConfigSources:
        """Read `MEMKV_CONFIG` from `env` (default: `os.environ`).

        A key in the file that is neither a client setting nor one of `plugin_keys`
        raises `ConfigError` (a typo must not be ignored); unknown `MEMKV_*`
        variables are left alone (other programs may own them).
        """
        env = os.environ if env is None else env
        path = env.get("MEMKV_CONFIG", "")
        values = _read_yaml(path) if path else {}
        known = set(_FIELDS) | set(plugin_keys)
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise ConfigError("MEMKV_CONFIG", f"{path}: {unknown_keys_message(unknown, known)}")
        return cls(env, path, values)

    def lookup(self, name: str) -> RawSetting | None:
        """`name` from the `MEMKV_CONFIG` file, else from `env_name(name)`, else None."""
        if name in self.file_values:
            return RawSetting(self.file_values[name], f"MEMKV_CONFIG {self.path}", name, True)
        var = env_name(name)
        if var in self.env:
            return RawSetting(self.env[var], "environment", var, False)
        return None

    def client_config(self, **overrides: Any) -> Config:
        """The client's validated `Config`; `overrides` (setting names) win over both
        sources, and a `None` override counts as not given."""
        unknown = sorted(k for k in overrides if k not in _FIELDS)
        if unknown:
            raise ConfigError("Client(...)", unknown_keys_message(unknown, _FIELDS))
        values: dict[str, Any] = {}
        for name in _FIELDS:
            if overrides.get(name) is not None:
                raw, source = overrides[name], f"Client({name}=...)"
            elif (found := self.lookup(name)) is not None:
                raw = found.value
                source = f"{name} in MEMKV_CONFIG {self.path!r}" if found.in_file else found.key
            else:
                continue
            try:
                values[name] = _convert(name, raw)
            except ValueError as exc:
                raise ConfigError(source, str(exc)) from None
        return Config(**values)


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a `Config` from overrides, `MEMKV_CONFIG`, `MEMKV_*` and defaults
    (`ConfigSources.read(env).client_config(**overrides)`)."""
    return ConfigSources.read(env).client_config(**overrides)
