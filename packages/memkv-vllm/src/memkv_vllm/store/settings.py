"""Which store backs memkv-vllm, and how to reach it: `StoreConfig`.

Each key is looked up in order, the first source that has it wins:

1. the vLLM config: the tier entry in `secondary_tiers` (`"backend": "mooncake"`), or
   `kv_connector_extra_config` of the direct spec with the `memkv_` prefix
   (`"memkv_backend": "mooncake"`);
2. the `MEMKV_CONFIG` YAML file (`backend: mooncake`);
3. the environment, `MEMKV_` + the key in capitals (`MEMKV_BACKEND=mooncake`);
4. the defaults below.

Steps 2 and 3 are memkv-client's one loader (`memkv_client.ConfigSources`, the same
precedence for every MemKV setting), read once per `resolve` and kept on the result for
the memkv backend's client.

A bad value fails startup with a `ConfigError` naming the key, where it came from and
what is accepted; the backend named checks its own keys (`check_config`, see
`.registry`). The memkv backend's own connection settings (servers,
auth key, transport) stay with `memkv_client` (same file and `MEMKV_*` variables).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memkv_client import ConfigSources

from ..errors import ConfigError
from .registry import backend_class, backend_names

__all__ = ["MIN_TRANSFER_RATE", "StoreConfig", "read_sources", "store_keys"]

MIN_TRANSFER_RATE = 256 << 20
"""Bytes per second a data call is granted on top of the stall budget."""


@dataclass(frozen=True)
class StoreConfig:
    """The store settings shared by both modes (keys as written in YAML and tier entries)."""

    stall_budget_s: float = 1.0
    """The longest the engine waits on the store in one call (seconds; 0.01-60): a lookup
    round unanswered by then is a miss, a load that misses it is recomputed, a store is
    dropped. Calls that move data get `MIN_TRANSFER_RATE` on top for their bytes. A
    member that missed it is skipped until a background probe answers."""
    backend: str = "memkv"
    """`memkv` (`memkv serve` cluster), `mooncake` (Mooncake Store), or another backend's
    `package.module:Class` (see `.registry`)."""
    mooncake_master: str = ""
    """`host:port` of `mooncake_master`'s RPC service (required for mooncake)."""
    mooncake_metadata_server: str = ""
    """Transfer-engine metadata service: `http://host:port/metadata` (the master's
    embedded one with `--enable_http_metadata_server=true`), `etcd://host:port`,
    `redis://host:port` or `P2PHANDSHAKE` (required for mooncake)."""
    mooncake_protocol: str = "tcp"
    """Transfer protocol: `tcp` or `rdma`."""
    mooncake_rdma_devices: str = ""
    """RDMA devices for `rdma` (comma-separated). Empty: the NIC on this rank's GPU's
    PCIe switch, read from sysfs (`MEMKV_RDMA_DEVICES` narrows the candidates)."""
    mooncake_local_hostname: str = ""
    """Address this process registers its segment under; empty: the host name."""
    mooncake_segment_mb: int = 0
    """Memory this process mounts into the shared pool (MiB); 0: a pure client."""
    mooncake_buffer_mb: int = 64
    """Transfer buffer of this process (MiB; small records, unregistered memory)."""
    mooncake_staging_mb: int = 256
    """Staging arena every batch moves through (MiB), registered once at startup; a
    batch moves in calls of at most a quarter of it. When calls that timed out still
    hold it all, a call fails at once (a miss, a dropped store)."""
    mooncake_replicas: int = 1
    """Copies of each value, on different segments (1-16)."""

    sources: ConfigSources | None = field(default=None, compare=False, repr=False)
    """Where `resolve` read `MEMKV_CONFIG` / `MEMKV_*` (None: not resolved; read anew)."""

    RANGES = {"mooncake_segment_mb": (0, 1 << 24), "mooncake_buffer_mb": (16, 1 << 20),
              "mooncake_staging_mb": (4, 1 << 20), "mooncake_replicas": (1, 16),
              "stall_budget_s": (0.01, 60)}  # fmt: skip

    def deadline_s(self, nbytes: int = 0) -> float:
        """The deadline of one call that moves `nbytes` bytes (seconds)."""
        return self.stall_budget_s + nbytes / MIN_TRANSFER_RATE

    @classmethod
    def resolve(
        cls,
        vllm_values: Mapping[str, Any],
        where: str,
        key_prefix: str = "",
        env: Mapping[str, str] | None = None,
    ) -> StoreConfig:
        """Merge the sources in order; `vllm_values` keys carry `key_prefix`; `env`
        defaults to `os.environ`."""
        sources = read_sources(env)
        values: dict[str, Any] = {}
        for f in _SETTINGS:
            name = f.name
            if key_prefix + name in vllm_values:
                raw, source = vllm_values[key_prefix + name], (where, key_prefix + name)
            elif (found := sources.lookup(name)) is not None:
                raw, source = found.value, (found.where, found.key)
            else:
                continue
            values[name] = _convert(name, f.type, raw, *source)
        cfg = cls(**values, sources=sources)
        cfg._check(where, key_prefix)
        return cfg

    def _check(self, where: str, key_prefix: str) -> None:
        accepted = f"accepted: {', '.join(backend_names())} or a package.module:Class"
        try:
            cls = backend_class(self.backend)
        except ValueError:
            raise ConfigError(where, key_prefix + "backend", f"got {self.backend!r}; {accepted}"
                              ) from None  # fmt: skip
        except (ImportError, AttributeError) as exc:
            raise ConfigError(where, key_prefix + "backend", f"got {self.backend!r}, which "
                              f"cannot be imported ({exc}); {accepted}") from None  # fmt: skip
        cls.check_config(self, where, key_prefix)


_SETTINGS = [f for f in dataclasses.fields(StoreConfig) if f.name != "sources"]


def store_keys(prefix: str) -> frozenset[str]:
    """The store keys as they appear in a vLLM config whose keys carry `prefix`."""
    return frozenset(prefix + f.name for f in _SETTINGS)


def read_sources(env: Mapping[str, str] | None = None) -> ConfigSources:
    """`MEMKV_CONFIG` and `MEMKV_*` of `env` (default `os.environ`), read once; the file
    may hold memkv-client's settings and ours. Raises `memkv_client.ConfigError` naming
    the file for an unreadable file or an unknown key in it."""
    return ConfigSources.read(env, plugin_keys=store_keys(""))


def _convert(name: str, kind: Any, raw: Any, where: str, key: str) -> Any:
    if str(kind) == "str":
        if not isinstance(raw, str):
            raise ConfigError(where, key, f"got {raw!r}; accepted: a string")
        return raw.strip()
    number, form = (float, "a number") if str(kind) == "float" else (int, "an integer")
    lo, hi = StoreConfig.RANGES[name]
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ConfigError(where, key, f"got {raw!r}; accepted: {form} from {lo} to {hi}")
    try:
        value = number(raw)
    except ValueError:
        raise ConfigError(where, key, f"got {raw!r}; accepted: {form} from {lo} to {hi}") from None
    if number is int and isinstance(raw, float) and value != raw:
        raise ConfigError(where, key, f"got {raw!r}; accepted: {form} from {lo} to {hi}")
    if not lo <= value <= hi:
        raise ConfigError(where, key, f"got {raw!r}; accepted: {lo} to {hi}")
    return value
