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

import enum
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kv_offload_settings
from kv_offload_settings import (
    Setting,
    read_config_file,
    setting,
    settings_of,
    unknown_keys_message,
)

from .auth import check_key, parse_key
from .environment import CONFIG_ENV
from .errors import ConfigError
from .sockio import parse_address

__all__ = [
    "SETTINGS",
    "Config",
    "ConfigSources",
    "RawSetting",
    "Transport",
    "env_name",
    "load_config",
]
_MTUS = (256, 512, 1024, 2048, 4096)


class Transport(enum.Enum):
    """`auto` prefers RDMA and falls back to TCP; `rdma`/`rdma-rc` require RDMA."""

    AUTO = "auto"
    TCP = "tcp"
    RDMA = "rdma"
    RDMA_RC = "rdma-rc"


_RDMA_PATH = "RoCE/IB path setting."


@dataclass(frozen=True)
class Config:
    """Validated client settings (defaults mirror the vendor client's), each declared once
    with its variable; `SETTINGS` is the README table's source."""

    servers: tuple[str, ...] = setting(
        "any",
        "Server addresses; keys are spread over them by HRW hashing.",
        ("127.0.0.1:9900",),
        accepts="distinct `host:port` addresses (a list, or comma-separated)",
        env="MEMKV_SERVERS",
    )
    rdma_devices: tuple[str, ...] = setting(
        "any",
        "RDMA devices the client may open (the NIC candidates, see RDMA).",
        ("mlx5_0",),
        accepts="device names (a list, or comma-separated)",
        env="MEMKV_RDMA_DEVICES",
    )
    bind_addresses: tuple[str | None, ...] = setting(
        "any",
        "Local source address per server (round robin); not set: any.",
        (None,),
        accepts="addresses (a list, or comma-separated; `none` for any)",
        env="MEMKV_BIND_ADDRESSES",
    )
    cache_size_mb: int = setting(
        "int",
        "Accepted for compatibility; unused (this client keeps no local value cache).",
        256,
        minimum=0,
        maximum=1 << 20,
        env="MEMKV_CACHE_SIZE_MB",
    )
    connect_timeout_ms: int = setting(
        "int",
        "TCP connect + HELLO, and each background probe; never more than the call's budget.",
        5000,
        maximum=3_600_000,
        env="MEMKV_CONNECT_TIMEOUT_MS",
    )
    request_timeout_ms: int = setting(
        "int",
        "Default budget of a whole call (plus 1 s per 16 MiB of values), when the call "
        "passes no `timeout=`. A member that misses a deadline is skipped until a background "
        "probe succeeds.",
        5000,
        maximum=86_400_000,
        env="MEMKV_REQUEST_TIMEOUT_MS",
    )
    probe_interval_ms: int = setting(
        "int",
        "Longest pause between background probes of a server marked down (they start at "
        "50 ms and double up to this).",
        500,
        minimum=10,
        maximum=60_000,
        env="MEMKV_PROBE_INTERVAL_MS",
    )
    gid_index: int = setting(
        "int", _RDMA_PATH, 0, minimum=0, maximum=255, env="MEMKV_RDMA_GID_INDEX"
    )
    traffic_class: int = setting(
        "int", _RDMA_PATH, 0, minimum=0, maximum=255, env="MEMKV_RDMA_TRAFFIC_CLASS"
    )
    service_level: int = setting(
        "int", _RDMA_PATH, 0, minimum=0, maximum=15, env="MEMKV_RDMA_SERVICE_LEVEL"
    )
    pkey_index: int = setting(
        "int", _RDMA_PATH, 0, minimum=0, maximum=65535, env="MEMKV_RDMA_PKEY_INDEX"
    )
    mtu: int = setting(
        "any",
        "RDMA path MTU.",
        4096,
        accepts=f"one of {list(_MTUS)}",
        env="MEMKV_MTU",
    )
    rdma_timeout_secs: int = setting(
        "int", "Wait for one RDMA completion.", 10, maximum=3600, env="MEMKV_RDMA_TIMEOUT_SECS"
    )
    num_connections: int = setting(
        "int",
        "Connections (and concurrent requests) per server.",
        8,
        maximum=256,
        env="MEMKV_NUM_CONNECTIONS",
    )
    license: str | None = setting(
        "any",
        "Accepted and ignored: the open client has no licence check.",
        None,
        accepts="any text",
        optional=True,
        env="MEMKV_LICENSE",
    )
    auth_key: bytes | None = setting(
        "any",
        "Shared HMAC key. Not set: loopback-only setups use the per-user key file "
        "`MEMKV_AUTH_KEY_FILE` (default `~/.config/memkv/auth.key`, created random with mode "
        "0600; shared with a server run by the same user).",
        None,
        accepts="64 hex digits, not all zero",
        optional=True,
        secret=True,
        env="MEMKV_AUTH_KEY",
    )
    transport: Transport = setting(
        "any",
        "`auto` prefers RDMA and falls back to TCP; `rdma` / `rdma-rc` require RDMA.",
        Transport.AUTO,
        accepts=f"one of {[t.value for t in Transport]}",
        env="MEMKV_TRANSPORT",
    )
    max_batch_size: int = setting(
        "int",
        "Items per request; larger batches are split and sent concurrently.",
        64,
        maximum=1024,
        env="MEMKV_MAX_BATCH_SIZE",
    )
    max_request_mb: int = setting(
        "int",
        "Value MiB per request; larger batches are split and sent concurrently.",
        64,
        maximum=4096,
        env="MEMKV_MAX_REQUEST_MB",
    )
    staging_size_mb: int = setting(
        "int",
        "RDMA staging pool for unregistered buffers.",
        256,
        maximum=1 << 20,
        env="MEMKV_STAGING_SIZE_MB",
    )
    staging_slot_mb: int = setting(
        "int",
        "RDMA staging slot (the largest unregistered value moved in one piece).",
        16,
        maximum=4096,
        env="MEMKV_STAGING_SLOT_MB",
    )


SETTINGS: dict[str, Setting] = settings_of(Config)
"""Every client setting, declared once (the README's table)."""


def env_name(name: str) -> str:
    """The environment variable that sets `name` (a client setting's declared one, else
    `MEMKV_<NAME>`)."""
    declared = SETTINGS.get(name)
    return declared.env if declared is not None else "MEMKV_" + name.upper()


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"a list or a comma-separated string, not a {type(value).__name__}")


def _servers(value: Any) -> tuple[str, ...]:
    servers = [str(s) for s in _as_list(value)]
    if not servers:
        raise ValueError("at least one server is required")
    for s in servers:
        parse_address(s)
    if len(set(servers)) != len(servers):
        raise ValueError("duplicate server addresses")
    return tuple(servers)


def _bind_addresses(value: Any) -> tuple[str | None, ...]:
    out = [None if a in (None, "", "none", "None") else str(a) for a in _as_list(value)]
    return tuple(out) or (None,)


def _auth_key(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return check_key(value)
    return parse_key(str(value))


def _mtu(value: Any) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) not in _MTUS:
        raise ValueError("")
    return int(text)


def _transport(value: Any) -> Transport:
    try:
        return Transport(str(value).strip().lower())
    except ValueError:
        raise ValueError("") from None


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "servers": _servers,
    "rdma_devices": lambda value: tuple(str(d) for d in _as_list(value)),
    "bind_addresses": _bind_addresses,
    "transport": _transport,
    "auth_key": _auth_key,
    "license": str,
    "mtu": _mtu,
}
"""Settings of kind `any`: value -> normalised, or ValueError with the reason (or "")."""


def _checked(name: str, raw: Any, key: str, where: str) -> Any:
    """`raw` normalised; ConfigError `<where>: <key> must be <accepted>, got <raw>`."""
    declared = SETTINGS[name]
    convert = _CONVERT.get(name)
    try:
        value = declared.check(raw, key)
        return value if convert is None or value is None else convert(value)
    except kv_offload_settings.ConfigError as exc:
        raise ConfigError(where, str(exc)) from None
    except ValueError as exc:
        reason = f" ({exc})" if str(exc) else ""
        got = declared.got(raw)
        raise ConfigError(where, f"{key} must be {declared.accepted()}{got}{reason}") from None


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        return read_config_file(path)
    except kv_offload_settings.ConfigError as exc:
        raise ConfigError(f"MEMKV_CONFIG {path}", str(exc).removeprefix(f"{path}: ")) from None


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
        path = env.get(CONFIG_ENV, "")
        values = _read_yaml(path) if path else {}
        known = set(SETTINGS) | set(plugin_keys)
        unknown = sorted(k for k in values if k not in known)
        if unknown:
            raise ConfigError(f"MEMKV_CONFIG {path}", unknown_keys_message(unknown, known))
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
        unknown = sorted(k for k in overrides if k not in SETTINGS)
        if unknown:
            raise ConfigError("Client(...)", unknown_keys_message(unknown, SETTINGS))
        values: dict[str, Any] = {}
        for name in SETTINGS:
            if overrides.get(name) is not None:
                values[name] = _checked(name, overrides[name], name, "Client(...)")
            elif (found := self.lookup(name)) is not None:
                values[name] = _checked(name, found.value, found.key, found.where)
        return Config(**values)


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a `Config` from overrides, `MEMKV_CONFIG`, `MEMKV_*` and defaults
    (`ConfigSources.read(env).client_config(**overrides)`)."""
    return ConfigSources.read(env).client_config(**overrides)
