"""The store both modes move KV through: the `KVStore` interface, its settings
(`StoreConfig`) and the backends behind it, opened by name (`open_store`).

Backends live in their own modules (`.memkv`, `.mooncake`), imported only when named;
`.registry` says how to add one. No vLLM import.
"""

from __future__ import annotations

from .protocol import OK, Item, ItemOutcome, KVStore, MemberState, StoreCounters
from .registry import BACKENDS, backend_class, register_backend
from .settings import MIN_TRANSFER_RATE, StoreConfig, store_keys, store_settings

__all__ = [
    "BACKENDS",
    "MIN_TRANSFER_RATE",
    "OK",
    "Item",
    "ItemOutcome",
    "KVStore",
    "MemberState",
    "StoreConfig",
    "StoreCounters",
    "backend_class",
    "open_store",
    "register_backend",
    "store_keys",
    "store_settings",
]


def open_store(
    config: StoreConfig,
    probe: bool,
    who: str,
    gpu: int | None = None,
    engine: str | None = None,
) -> KVStore:
    """The store `config.backend` names; with `probe`, fail now if it is unreachable.

    `who` names the caller in errors and logs; `gpu` is its CUDA device index, None
    without one: over RDMA, a backend drives the NIC next to that GPU. `engine` (vLLM's
    engine id) shares the members this store finds down with the engine's other stores
    (`.health_board`; None: shared with none).
    """
    cls = backend_class(config.backend)
    store: KVStore = cls(config, probe=probe, who=who, gpu=gpu, engine=engine)
    return store
