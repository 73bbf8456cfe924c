"""Client configuration: `MEMKV_CONFIG` (YAML) first, then `MEMKV_*` variables, then defaults.

Each setting is looked up in that order and the first source that has it wins; keyword
overrides given to `Client(...)` win over all three. Every value is validated and a
bad one raises `memkv_client.errors.ConfigError` naming the setting and its
source. There is no licence check: a `license` entry is accepted and ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .auth import check_key, parse_key
from .errors import ConfigError
from .sockio import parse_address

__all__ = ["Config", "Transport", "load_config"]


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
    """Deadline for any single socket wait during a request (sends get this plus 1 s per
    16 MiB); after a timeout the server is skipped (fail fast) for this long."""
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
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("MEMKV_CONFIG", f"cannot read {path!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("MEMKV_CONFIG", f"{path!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("MEMKV_CONFIG", f"{path!r} must hold a mapping of settings")
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise ConfigError(
            "MEMKV_CONFIG",
            f"unknown setting(s) {', '.join(unknown)} in {path!r}; known: {', '.join(_FIELDS)}",
        )
    return {str(k): v for k, v in data.items()}


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a `Config` from overrides, `MEMKV_CONFIG`, `MEMKV_*` and defaults."""
    env = os.environ if env is None else env
    unknown = sorted(k for k in overrides if k not in _FIELDS)
    if unknown:
        raise ConfigError(unknown[0], f"unknown setting; known: {', '.join(_FIELDS)}")
    path = env.get("MEMKV_CONFIG")
    yaml_values = _read_yaml(path) if path else {}
    values: dict[str, Any] = {}
    for name in _FIELDS:
        if name in overrides and overrides[name] is not None:
            raw, source = overrides[name], f"Client({name}=...)"
        elif name in yaml_values:
            raw, source = yaml_values[name], f"{name} in MEMKV_CONFIG {path!r}"
        elif env_name(name) in env:
            raw, source = env[env_name(name)], env_name(name)
        else:
            continue
        try:
            values[name] = _convert(name, raw)
        except ValueError as exc:
            raise ConfigError(source, str(exc)) from None
    return Config(**values)
