"""Store backends by name, resolved lazily (nothing is imported until a backend is used).

A backend is a class implementing `.protocol.KVStore`, built by `open_store` as
`cls(config, probe=..., who=..., gpu=..., engine=...)` (`engine`: share what it finds
down through a `.health_board.HealthBoard` for that engine). The class declares:

* `Settings` (optional; absent: no keys of its own): a frozen dataclass whose fields are
  its store keys, each declared with `kv_offload_settings.setting` (kind, default,
  bounds, doc); `StoreConfig.resolve` builds it as `config.backend_settings`, and the
  README's store table lists it;
* `check_config(config, where, key_prefix)`: raise `ConfigError` for a value of its own
  keys that the declarations cannot check (e.g. an address's form);
* `doctor_checks(config, timeout) -> list[Check]` (optional): `python -m memkv_vllm
  doctor`'s probes of its members (`vllm_kv_identity.doctor.Check`), each ending
  within `timeout` seconds;
* `uses_rdma(config) -> bool` (optional; absent: False): whether values move over RDMA
  (the doctor then requires the pinned memory to be lockable).

The `backend` setting names one of `BACKENDS`, or any class by its
`package.module:Class` path (a backend in another distribution needs no change here; its
`Settings` keys are accepted in `MEMKV_CONFIG` and tier entries once `register_backend`
names it). A new in-tree backend is one module and one line in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BACKENDS", "backend_class", "backend_names", "register_backend"]

BACKENDS: dict[str, str] = {
    "memkv": "memkv_vllm.store.memkv:MemKVStore",
    "mooncake": "memkv_vllm.store.mooncake:MooncakeStore",
}
"""Backend name -> `package.module:Class`."""


def register_backend(name: str, target: str) -> None:
    """Make `backend: name` mean the class at `target` (`package.module:Class`)."""
    if ":" not in target:
        raise ValueError(f"backend target {target!r} is not of the form package.module:Class")
    BACKENDS[name] = target


def backend_names() -> list[str]:
    return sorted(BACKENDS)


def backend_class(backend: str) -> Any:  # `Any`: a class whose instances are `KVStore`s
    """The class `backend` names (a registered name or `package.module:Class`).

    Raises `ValueError` for an unknown name, `ImportError` / `AttributeError` for a path
    that does not lead to a class.
    """
    target = BACKENDS.get(backend, backend)
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"unknown backend {backend!r}")
    return getattr(importlib.import_module(module), name)
