"""KV events for the shared store: what this engine stored there and found there.

vLLM's OffloadingConnector publishes what its managers and tiers report through
`take_events()`; `SharedTierEvents` is that report for a shared store, in vLLM's medium
`STORAGE` with locality `REMOTE` (the blocks live outside this engine, shared with every
engine on the store). A block is announced once when a store of it succeeds or a lookup
finds it, and announced removed when this engine finds it gone (a lookup misses, a load
fails). What the servers evict on their own is not seen until then: a router may count a
hit that turns out to be a miss (the engine recomputes), never the other way round.
With vLLM's `self_describing_kv_events`, vLLM adds token ids and parents to the blocks it
saw stored or hit; other blocks are published by hash, as vLLM does.

Built only when vLLM's KV events are on (`--kv-events-config`); otherwise the managers
hold None and do no event work.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from . import _compat as c
from .lookup import Answer

__all__ = ["MAX_ANNOUNCED", "SharedTierEvents"]

MAX_ANNOUNCED = 1 << 20
"""Blocks remembered as announced (about 100 bytes each); beyond that the oldest are
forgotten and announced again when next seen (routers count repeats once)."""


class SharedTierEvents:
    """Announced blocks and the events not yet taken; scheduler thread only."""

    def __init__(
        self,
        make_event: Callable[[list[Any], bool], Any] | None = None,
        max_announced: int = MAX_ANNOUNCED,
    ) -> None:
        self._make = make_event or c.shared_storage_event
        self._announced: OrderedDict[Any, None] = OrderedDict()
        self._max = max_announced
        self._events: list[Any] = []

    def present(self, keys: Iterable[Any]) -> None:
        """These blocks are in the store (stored, or found by a lookup)."""
        new = []
        for key in keys:
            if key in self._announced:
                self._announced.move_to_end(key)
                continue
            self._announced[key] = None
            new.append(key)
        if new:
            self._events.append(self._make(new, False))
        while len(self._announced) > self._max:
            self._announced.popitem(last=False)

    def absent(self, keys: Iterable[Any]) -> None:
        """These blocks were found missing (a lookup missed, a load failed)."""
        gone = [key for key in keys if key in self._announced]
        for key in gone:
            del self._announced[key]
        if gone:
            self._events.append(self._make(gone, True))

    def on_lookup(self, key: Any, answer: Answer) -> None:
        """A lookup's answer: HIT announces the block, MISS removes an announced one."""
        if answer is Answer.HIT:
            self.present((key,))
        elif answer is Answer.MISS:
            self.absent((key,))

    def on_job(self, is_load: bool, ok: Iterable[Any], failed: Iterable[Any]) -> None:
        """A finished transfer: blocks stored or loaded are there, failed loads are not."""
        self.present(ok)
        if is_load:
            self.absent(failed)

    def take(self) -> list[Any]:
        """vLLM `OffloadingEvent`s since the last call, oldest first."""
        events, self._events = self._events, []
        return events
