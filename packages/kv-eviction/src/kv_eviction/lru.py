"""`lru`: evict the least recently inserted-or-hit leaf block first."""

from __future__ import annotations

from typing import Any

from .chainheap import ChainHeapPolicy
from .policy import reject_unknown_options

__all__ = ["LRUPolicy"]


class LRUPolicy(ChainHeapPolicy):
    """Least recently used, restricted to unpinned keys without a tracked child."""

    name = "lru"

    def _grow(self) -> None:
        pass

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        return seq

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        return seq


def build(**options: Any) -> LRUPolicy:
    reject_unknown_options("lru", options, ())
    return LRUPolicy()
