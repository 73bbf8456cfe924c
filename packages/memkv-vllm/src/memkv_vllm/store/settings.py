"""Which store backs memkv-vllm, and how to reach it: `StoreConfig`.

Each key is looked up in order, the first source that has it wins:

1. the vLLM config: the tier entry in `secondary_tiers` (`"backend": "mooncake"`), or
   `kv_connector_extra_config` of the direct spec with the `memkv_` prefix
   (`"memkv_backend": "mooncake"`);
2. the `MEMKV_CONFIG` YAML file (`backend: mooncake`);
3. the environment, `MEMKV_` + the key in capitals (`MEMKV_BACKEND=mooncake`);
4. the defaults below.

A bad value fails startup with a `.config.ConfigError` naming the key, where it
came from and what is accepted. The memkv backend's own connection settings (servers,
auth key, transport) stay with `memkv_client` (same file and `MEMKV_*` variables).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError

__all__ = ["BACKENDS", "PROTOCOLS", "StoreConfig", "store_keys", "yaml_file", "yaml_settings"]

BACKENDS = ("memkv", "mooncake")
PROTOCOLS = ("tcp", "rdma")
METADATA_SCHEMES = ("http://", "etcd://", "redis://", "P2PHANDSHAKE")


@dataclass(frozen=True)
class StoreConfig:
    """The store settings shared by both modes (keys as written in YAML and tier entries)."""

    backend: str = "memkv"
    """`memkv` (`memkv serve` cluster) or `mooncake` (Mooncake Store)."""
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
    mooncake_replicas: int = 1
    """Copies of each value, on different segments (1-16)."""

    RANGES = {"mooncake_segment_mb": (0, 1 << 24), "mooncake_buffer_mb": (16, 1 << 20),
              "mooncake_replicas": (1, 16)}  # fmt: skip

    @classmethod
    def resolve(
        cls,
        vllm_values: Mapping[str, Any],
        where: str,
        key_prefix: str = "",
        env: Mapping[str, str] | None = None,
    ) -> StoreConfig:
        """Merge the sources in order; `vllm_values` keys carry `key_prefix`."""
        env = os.environ if env is None else env
        yaml_values, yaml_path = yaml_settings(env)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.name
            if key_prefix + name in vllm_values:
                raw, source = vllm_values[key_prefix + name], (where, key_prefix + name)
            elif name in yaml_values:
                raw, source = yaml_values[name], (f"MEMKV_CONFIG {yaml_path}", name)
            elif "MEMKV_" + name.upper() in env:
                raw, source = env["MEMKV_" + name.upper()], ("environment", f"MEMKV_{name.upper()}")
            else:
                continue
            values[name] = _convert(name, f.type, raw, *source)
        cfg = cls(**values)
        cfg._check(where, key_prefix)
        return cfg

    def _check(self, where: str, key_prefix: str) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(where, key_prefix + "backend", f"got {self.backend!r}; "
                              f"accepted: {', '.join(BACKENDS)}")  # fmt: skip
        if self.backend != "mooncake":
            return
        if self.mooncake_protocol not in PROTOCOLS:
            raise ConfigError(where, key_prefix + "mooncake_protocol", f"got "
                              f"{self.mooncake_protocol!r}; accepted: {', '.join(PROTOCOLS)}")  # fmt: skip
        host, _, port = self.mooncake_master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                where, key_prefix + "mooncake_master", f"got {self.mooncake_master!r}; "
                "accepted: host:port of mooncake_master's RPC service (e.g. 10.0.0.5:50051)",
            )  # fmt: skip
        if not self.mooncake_metadata_server.startswith(METADATA_SCHEMES):
            raise ConfigError(
                where, key_prefix + "mooncake_metadata_server",
                f"got {self.mooncake_metadata_server!r}; accepted: http://host:port/metadata, "
                "etcd://host:port, redis://host:port or P2PHANDSHAKE",
            )  # fmt: skip


def store_keys(prefix: str) -> frozenset[str]:
    """The store keys as they appear in a vLLM config whose keys carry `prefix`."""
    return frozenset(prefix + f.name for f in dataclasses.fields(StoreConfig))


def yaml_file(env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """Every setting in the `MEMKV_CONFIG` file (ours and memkv-client's; `{}` without
    one) and its path."""
    path = env.get("MEMKV_CONFIG")
    if not path:
        return {}, ""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("MEMKV_CONFIG", path, f"cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("MEMKV_CONFIG", path, "must hold a mapping of settings")
    return data, path


def yaml_settings(env: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """Our keys from the `MEMKV_CONFIG` file (`{}` without one) and its path."""
    data, path = yaml_file(env)
    ours = {f.name for f in dataclasses.fields(StoreConfig)}
    return {k: v for k, v in data.items() if k in ours}, path


def _convert(name: str, kind: Any, raw: Any, where: str, key: str) -> Any:
    if str(kind) == "str":
        if not isinstance(raw, str):
            raise ConfigError(where, key, f"got {raw!r}; accepted: a string")
        return raw.strip()
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ConfigError(where, key, f"got {raw!r}; accepted: an integer")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(where, key, f"got {raw!r}; accepted: an integer") from None
    lo, hi = StoreConfig.RANGES[name]
    if not lo <= value <= hi:
        raise ConfigError(where, key, f"got {raw!r}; accepted: {lo} to {hi}")
    return value
