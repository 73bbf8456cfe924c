"""The store interface both modes talk to, and its per-item result.

The tier and the direct mode move KV through a `KVStore`: batched presence probes,
batched puts from and gets into caller-owned buffers, deletes, small metadata records and
counters. Implementations: `.memkv.MemKVStore` (our `memkv serve` cluster through
`memkv_client`) and `.mooncake.MooncakeStore` (Mooncake Store), found by name through
`.registry`. No vLLM import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

__all__ = ["OK", "Item", "ItemOutcome", "KVStore", "MemberState", "StoreCounters"]

Item = tuple[bytes, Any, int]
"""`(key, buffer, length)`: a writable (get) or readable (put) buffer of `length` bytes."""


class ItemOutcome(NamedTuple):
    """What happened to one item of a batch; truthy only when `ok`.

    `unavailable`: not done because `member` missed the call's deadline or is skipped
    as down (the value may well be there; a timeout, not a miss).
    """

    ok: bool
    cause: str = ""
    member: str = ""
    unavailable: bool = False

    def __bool__(self) -> bool:
        return self.ok


OK = ItemOutcome(True)


class MemberState(NamedTuple):
    """One member of a store (a server, a master) as its client sees it."""

    address: str
    up: bool
    went_down: int = 0
    """Transitions to down since the store was opened."""
    came_up: int = 0
    """Transitions back to up."""


@dataclass
class StoreCounters:
    """Operation counters every store keeps (what `KVStore.stats` reports)."""

    exists_keys: int = 0
    exists_errors: int = 0
    put_ok: int = 0
    put_failed: int = 0
    put_bytes: int = 0
    get_ok: int = 0
    get_missed: int = 0
    get_bytes: int = 0
    unavailable: int = 0
    """Items not done because their member timed out or was skipped as down."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: int(getattr(self, f.name)) for f in fields(self)}

    def count_puts(self, outcomes: Sequence[ItemOutcome], items: Sequence[Item]) -> None:
        good = [item[2] for item, o in zip(items, outcomes, strict=True) if o]
        self.add(put_ok=len(good), put_failed=len(items) - len(good), put_bytes=sum(good),
                 unavailable=sum(o.unavailable for o in outcomes))  # fmt: skip

    def count_gets(self, outcomes: Sequence[ItemOutcome], items: Sequence[Item]) -> None:
        good = [item[2] for item, o in zip(items, outcomes, strict=True) if o]
        self.add(get_ok=len(good), get_missed=len(items) - len(good), get_bytes=sum(good),
                 unavailable=sum(o.unavailable for o in outcomes))  # fmt: skip


class KVStore(Protocol):
    """A shared KV value store. Thread-safe; every batch call answers per item, in order.

    Every call returns within its deadline, `StoreConfig.deadline_s(bytes moved)`. A
    member that misses one is skipped as down (its keys read as absent, its items are
    `unavailable`) until a background probe finds it answering again; `health` reports
    each member. A call that returned never touches the caller's buffers afterwards.

    Values are immutable: a put of a key that is present may keep the old value (both
    backends' values are content-addressed here, so that is harmless). A get fills the
    buffer completely or reports a miss; it never returns a partial value as `ok`.
    """

    backend: str
    """`memkv` or `mooncake` (for logs and metrics)."""

    settings_hint: str
    """Where users set this backend's address, for errors about reaching it."""

    @property
    def has_rdma(self) -> bool:
        """Whether values move over RDMA (False: TCP)."""
        ...

    def describe(self) -> str:
        """One line for the startup log: where the store is and how data moves."""
        ...

    def exists(self, keys: list[bytes]) -> list[bool]:
        """Presence of each key; a key the store cannot answer for reads as absent."""
        ...

    def unanswered(self, keys: list[bytes], running: Callable[[], bool]) -> None:
        """An `exists` call for `keys` missed its caller's deadline while `running()`: the
        members holding them are down for this engine's other calls (loads, stores) until
        that call has returned and this store's own record has them up."""
        ...

    def register(self, buffer: Any) -> None:
        """Announce a long-lived buffer that batch calls will use (zero-copy engines
        register it for transfers); buffers must stay alive until `close`."""
        ...

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        """Store each `(key, buffer, length)`."""
        ...

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        """Fill each buffer with the key's value of exactly `length` bytes."""
        ...

    def delete(self, keys: list[bytes]) -> list[ItemOutcome]:
        """Remove each key (not ok: absent, or the backend refused, e.g. under lease)."""
        ...

    def put_record(self, key: bytes, data: bytes) -> None:
        """Store a small metadata record (raises on failure)."""
        ...

    def get_record(self, key: bytes) -> bytes | None:
        """A small metadata record, or None if absent."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters of this process's operations plus what the backend reports."""
        ...

    def health(self) -> list[MemberState]:
        """Every member this store talks to, up or down (cheap: no network)."""
        ...

    def close(self) -> None: ...
