"""Which store backs memkv-vllm, and how to reach it: `StoreConfig`.

The shared keys (`backend`, `stall_budget_s`) are declared here; each backend declares its
own keys in its module (a `Settings` dataclass of `kv_offload_settings.setting` fields,
see `.registry`), and `StoreConfig.resolve` builds that backend's settings object.

Each key is looked up in order, the first source that has it wins:

1. the vLLM config: the tier entry in `secondary_tiers` (`"backend": "mooncake"`), or
   `kv_connector_extra_config` of the direct spec with the `memkv_` prefix
   (`"memkv_backend": "mooncake"`);
2. the `MEMKV_CONFIG` YAML file (`backend: mooncake`);
3. the environment, `MEMKV_` + the key in capitals (`MEMKV_BACKEND=mooncake`);
4. the declared default.

Steps 2 and 3 are memkv-client's one loader (`memkv_client.ConfigSources`, the same
precedence for every MemKV setting), read once per `resolve` and kept on the result for
the memkv backend's client.

A bad value fails startup with a `ConfigError` naming where it came from, the key and
what is accepted; the backend named checks its own keys further (`check_config`). The
memkv backend's connection settings (servers, auth key, transport) stay with
`memkv_client` (same file and `MEMKV_*` variables).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kv_offload_settings
from kv_offload_settings import Setting, did_you_mean, setting, settings_of
from memkv_client import ConfigSources
from memkv_client.config import env_name

from ..errors import ConfigError
from .registry import backend_class, backend_names

__all__ = ["MIN_TRANSFER_RATE", "StoreConfig", "read_sources", "store_keys", "store_settings"]

MIN_TRANSFER_RATE = 256 << 20
"""Bytes per second a data call is granted on top of the stall budget."""


@dataclass(frozen=True)
class StoreConfig:
    """The store settings shared by both modes (keys as written in YAML and tier entries),
    and the named backend's own (`backend_settings`)."""

    backend: str = setting(
        "text",
        "The store backend (see *Store backends*), or another backend's class.",
        "memkv",
        accepts="a registered backend or a package.module:Class",
    )
    stall_budget_s: float = setting(
        "number",
        "The longest one call to the store may take (seconds); calls that move data get 1 s "
        "per 256 MiB on top. A lookup round unanswered by then is a miss, a load that misses "
        "it is recomputed, a store is dropped; a member that missed it is skipped until a "
        "background probe answers (see *Failure modes*).",
        1.0,
        minimum=0.01,
        maximum=60,
    )
    backend_settings: Any = None
    """The backend's `Settings` built by `resolve` (None: the backend declares none)."""
    sources: ConfigSources | None = field(default=None, compare=False, repr=False)
    """Where `resolve` read `MEMKV_CONFIG` / `MEMKV_*` (None: not resolved; read anew)."""

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
        read = _Reader(vllm_values, where, key_prefix, sources)
        shared = read(_SHARED)
        name = shared.get("backend", _SHARED["backend"].default)
        backend = _backend(name, read.place("backend"), key_prefix)
        own = _settings_class(backend)
        cfg = cls(**shared, backend_settings=own(**read(settings_of(own))) if own else None,
                  sources=sources)  # fmt: skip
        backend.check_config(cfg, where, key_prefix)
        return cfg


_SHARED = settings_of(StoreConfig)


@dataclass(frozen=True)
class _Reader:
    """Reads declared settings from the sources in order (see the module docstring)."""

    vllm_values: Mapping[str, Any]
    where: str
    key_prefix: str
    sources: ConfigSources

    def place(self, name: str) -> str:
        """Where the value of `name` comes from (for errors)."""
        if self.key_prefix + name in self.vllm_values:
            return self.where
        found = self.sources.lookup(name)
        return found.where if found is not None else self.where

    def __call__(self, declared: Mapping[str, Setting]) -> dict[str, Any]:
        """The values given for `declared`, checked; ConfigError for a bad or missing one."""
        values = {}
        for name, s in declared.items():
            if self.key_prefix + name in self.vllm_values:
                raw, where = self.vllm_values[self.key_prefix + name], self.where
                key = self.key_prefix + name
            elif (found := self.sources.lookup(name)) is not None:
                raw, where, key = found.value, found.where, found.key
            elif s.default is dataclasses.MISSING:
                raise ConfigError(self.where, "", f"{self.key_prefix + name} is required (set it "
                                  f"here, in MEMKV_CONFIG or as {env_name(name)}); accepted: "
                                  f"{s.accepted()}")  # fmt: skip
            else:
                continue
            try:
                values[name] = s.check(raw.strip() if isinstance(raw, str) else raw, key)
            except kv_offload_settings.ConfigError as exc:
                raise ConfigError(where, "", str(exc)) from None
        return values


def _backend(name: str, where: str, key_prefix: str) -> Any:
    """The backend class `name` names, or ConfigError naming `where` and the choices."""
    key = key_prefix + "backend"
    accepted = f"one of {backend_names()} or a package.module:Class"
    try:
        return backend_class(name)
    except ValueError:
        hint = did_you_mean(name, backend_names())
        raise ConfigError(where, "", f"{key} must be {accepted}, got {name!r}{hint}") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(where, "", f"{key} must be {accepted}, got {name!r}, which cannot "
                          f"be imported ({exc})") from None  # fmt: skip


def _settings_class(backend: Any) -> type | None:
    """The backend's `Settings` declaration (None: it has no keys of its own)."""
    own: type | None = getattr(backend, "Settings", None)
    return own


def store_settings() -> dict[str, Setting]:
    """Every store key, the shared ones then each registered backend's, each with the
    environment variable that sets it (the README's table; `backend` lists the registered
    names)."""
    accepts = f"one of {backend_names()} or a backend's class as package.module:Class"
    declared = {**_SHARED, "backend": dataclasses.replace(_SHARED["backend"], accepts=accepts)}
    for name in backend_names():
        own = _settings_class(backend_class(name))
        declared.update(settings_of(own) if own else {})
    return {key: dataclasses.replace(s, env=env_name(key)) for key, s in declared.items()}


def store_keys(prefix: str) -> frozenset[str]:
    """The store keys as they appear in a vLLM config whose keys carry `prefix`."""
    return frozenset(prefix + key for key in store_settings())


def read_sources(env: Mapping[str, str] | None = None) -> ConfigSources:
    """`MEMKV_CONFIG` and `MEMKV_*` of `env` (default `os.environ`), read once; the file
    may hold memkv-client's settings and ours. Raises `memkv_client.ConfigError` naming
    the file for an unreadable file or an unknown key in it."""
    return ConfigSources.read(env, plugin_keys=store_keys(""))
