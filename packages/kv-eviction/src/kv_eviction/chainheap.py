"""The engine shared by the heap-based policies: slots, chains, pins and a lazy heap.

Layout (about 120-170 bytes per tracked key, see the benchmark): each key owns a slot
index into parallel `array`s (parent slot, child count, pin count) plus whatever the
policy adds. The dict maps key -> *item*, one Python int that packs the policy's
priority, a unique sequence number and the slot:

    item = (priority << SLOT_BITS) | slot        # priority already ends with the seq

Items compare like (priority, seq): the heap (`heapq` over ints) therefore orders by
priority, ties going to the oldest sequence number, i.e. the least recently used.

The heap holds only candidate victims and is invalidated lazily: an item is live while
`index[key] == item`; a touch stores a new item and leaves the old one behind as
garbage. A slot's `in_heap` flag says whether its live item sits in the heap. Keys with
a tracked child or a pin stay where they are until popped, then drop out, and are
pushed again when they become eligible (last child gone, last pin released). When the
heap holds more than `COMPACT_FACTOR` times the tracked keys it is rebuilt from the
index, so garbage stays bounded and every operation is O(log n) amortized.

A policy may give a new key a negative priority (below every non-negative one, as `auto`'s
doorkeeper rules do for first-time blocks). Those items go to a second heap, `_side`, on
insert: they arrive in increasing order, so pushing them costs O(1) instead of a sift to
the root of the main heap; victims come from `_side` first (its items are below every item of
the main heap), unless a subclass sets `_side_hold` and its `_side_first` keeps them a
while (`probation-lru`). Garbage in `_side` is
dropped as it reaches the top; a key that becomes eligible again and a rebuild put
negative items back in `_side`.
`lru` and `marconi` never have negative priorities, so `_side` stays empty for them.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from array import array
from collections.abc import Hashable

from .policy import EvictionPolicy, PolicyStats
from .retention import Retention

__all__ = ["RETENTION_SHIFT", "SEQ_BITS", "SLOT_BITS", "SLOT_MASK", "ChainHeapPolicy"]

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1
SEQ_BITS = 64
COMPACT_FACTOR = 2
COMPACT_SLACK = 1024
RETENTION_SHIFT = 192
"""Retention classes sit above every policy's own priority (all below 2**192): a HIGH
key's priority gains 2**192, a LOW key's loses it (negative, so it waits in `_side`)."""
_RETENTION_OFFSET = (-(1 << RETENTION_SHIFT), 0, 1 << RETENTION_SHIFT)
_NORMAL = int(Retention.NORMAL)


class _Marker:
    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return self.label


_FREE = _Marker("<free slot>")
# A removed key whose children are still tracked: its slot cannot be reused until then.
_TOMBSTONE = _Marker("<removed parent>")


class ChainHeapPolicy(EvictionPolicy):
    """Base class of the heap policies; public, so a policy can live outside the package.

    A subclass sets `name`, defines `_grow` (append one slot to its own per-slot arrays)
    and the priority of a key on insert and on touch: a non-negative int (or negative for
    keys that go before all others, see above) whose low `SEQ_BITS` are the `seq` passed
    in; lower is evicted first. A policy that watches every access extends `_accessed`,
    which ends each insert and touch. It inherits chain consistency, pins, lazy
    invalidation and the rest of `EvictionPolicy`; `register_policy(name, factory)` makes
    it available to `make_policy` and so to every configuration that asks
    `validate_policy`.
    """

    # Slots, not an instance dict: CPython 3.11 shares a dict's keys among instances only
    # up to 30 attributes, and past that every attribute access on the hot path slows
    # down (docs/benchmarks/history/cpu-eviction-step-rounds-2026-12-02.md). A subclass with
    # many attributes declares its own.
    __slots__ = (
        "_children",
        "_compactions",
        "_evictions",
        "_free",
        "_heap",
        "_in_heap",
        "_index",
        "_inserts",
        "_keys",
        "_now",
        "_parent",
        "_pinned",
        "_pins",
        "_removals",
        "_retention",
        "_seq",
        "_side",
        "_side_hold",
        "_touches",
    )

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._parent = array("i")
        self._children = array("I")
        self._pins = array("I")
        self._in_heap = bytearray()
        self._retention = bytearray()
        self._free: list[int] = []
        self._heap: list[int] = []
        self._side: list[int] = []
        self._side_hold = False
        """Whether `_side_first` decides when `_side`'s keys go (else they go first)."""
        self._seq = 0
        self._now = 0
        self._pinned = 0
        self._inserts = 0
        self._touches = 0
        self._evictions = 0
        self._removals = 0
        self._compactions = 0

    # --- what a policy defines -----------------------------------------------------

    @abstractmethod
    def _grow(self) -> None:
        """Append one slot to the policy's own per-slot arrays."""

    @abstractmethod
    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        """Priority (ending with `seq` in its low SEQ_BITS) of a freshly inserted key."""

    @abstractmethod
    def _priority_on_touch(self, slot: int, seq: int) -> int:
        """Priority of a key that was just hit."""

    # --- the interface -------------------------------------------------------------

    def insert(
        self,
        key: Hashable,
        parent: Hashable | None = None,
        depth: int = 0,
        retention: Retention = Retention.NORMAL,
    ) -> None:
        if key in self._index:
            raise KeyError(f"key {key!r} is already tracked")
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        slot = self._alloc()
        pslot = -1
        if parent is not None:
            pitem = self._index.get(parent)
            if pitem is not None:
                pslot = pitem & SLOT_MASK
                self._children[pslot] += 1
        self._keys[slot] = key
        self._parent[slot] = pslot
        self._seq += 1
        priority = self._priority_on_insert(slot, depth, self._seq)
        self._retention[slot] = retention
        if retention != _NORMAL:
            priority += _RETENTION_OFFSET[retention]
        item = (priority << SLOT_BITS) | slot
        self._index[key] = item
        heapq.heappush(self._side if item < 0 else self._heap, item)
        self._in_heap[slot] = 1
        self._inserts += 1
        self._accessed(slot)

    def touch(self, key: Hashable) -> None:
        item = self._lookup(key)
        slot = item & SLOT_MASK
        self._seq += 1
        priority = self._priority_on_touch(slot, self._seq)
        retention = self._retention[slot]
        if retention != _NORMAL:
            priority += _RETENTION_OFFSET[retention]
        self._replace_item(key, (priority << SLOT_BITS) | slot)
        self._touches += 1
        self._accessed(slot)

    def retention(self, key: Hashable) -> Retention:
        """The retention class `key` was inserted with (or last given). `KeyError` if
        untracked."""
        return Retention(self._retention[self._lookup(key) & SLOT_MASK])

    def set_retention(self, key: Hashable, retention: Retention) -> None:
        """Move `key` to another retention class, keeping its place within the class (a
        shared system prompt first stored by a normal request, then hit by one that asks
        to keep it). `KeyError` if untracked."""
        item = self._lookup(key)
        slot = item & SLOT_MASK
        old = self._retention[slot]
        if old == retention:
            return
        self._retention[slot] = retention
        priority = (item >> SLOT_BITS) - _RETENTION_OFFSET[old] + _RETENTION_OFFSET[retention]
        self._replace_item(key, (priority << SLOT_BITS) | slot)

    def _replace_item(self, key: Hashable, item: int) -> None:
        """Give `key` a new live item, queued at once if the key is eligible."""
        slot = item & SLOT_MASK
        self._index[key] = item
        if self._children[slot] == 0 and self._pins[slot] == 0:
            heapq.heappush(self._side if item < 0 else self._heap, item)
            self._in_heap[slot] = 1
        else:
            self._in_heap[slot] = 0

    def remove(self, key: Hashable) -> None:
        item = self._lookup(key)
        slot = item & SLOT_MASK
        del self._index[key]
        if self._pins[slot]:
            self._pinned -= 1
            self._pins[slot] = 0
        self._detach(slot)
        if self._children[slot]:
            self._keys[slot] = _TOMBSTONE
        else:
            self._release(slot)
        self._removals += 1

    def pin(self, key: Hashable) -> None:
        slot = self._lookup(key) & SLOT_MASK
        if self._pins[slot] == 0:
            self._pinned += 1
        self._pins[slot] += 1

    def unpin(self, key: Hashable) -> None:
        slot = self._lookup(key) & SLOT_MASK
        pins = self._pins[slot]
        if pins == 0:
            raise ValueError(f"key {key!r} is not pinned")
        self._pins[slot] = pins - 1
        if pins == 1:
            self._pinned -= 1
            self._make_candidate(slot)

    def pop_victims(self, n: int) -> list[Hashable]:
        victims: list[Hashable] = []
        heap = self._heap
        side = self._side
        index = self._index
        keys = self._keys
        while len(victims) < n and (heap or side):
            if side and (not heap or not self._side_hold or self._side_first()):
                item = heapq.heappop(side)
            else:
                item = heapq.heappop(heap)
            slot = item & SLOT_MASK
            key = keys[slot]
            if index.get(key) != item:
                continue  # garbage: the key was touched, removed or its slot reused
            self._in_heap[slot] = 0
            if self._children[slot] or self._pins[slot]:
                continue  # not eligible now; pushed again when it becomes eligible
            del index[key]
            self._detach(slot)
            self._release(slot)
            victims.append(key)
        self._evictions += len(victims)
        return victims

    def tick(self, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"tick n must be >= 0, got {n}")
        self._now += n

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._index
        except TypeError:
            return False

    def stats(self) -> PolicyStats:
        return PolicyStats(
            policy=self.name,
            entries=len(self._index),
            pinned=self._pinned,
            inserts=self._inserts,
            touches=self._touches,
            evictions=self._evictions,
            removals=self._removals,
            now=self._now,
            heap_size=len(self._heap),
            compactions=self._compactions,
        )

    # --- helpers -------------------------------------------------------------------

    def _retention_offset(self, slot: int) -> int:
        """What `slot`'s retention class adds to a priority the policy computes (for a
        policy that re-keys its keys, e.g. on a rule switch)."""
        return _RETENTION_OFFSET[self._retention[slot]]

    def _side_first(self) -> bool:
        """With `_side_hold`: whether the next victim comes from `_side` while both heaps
        hold items."""
        return True

    def _lookup(self, key: Hashable) -> int:
        try:
            return self._index[key]
        except KeyError:
            raise KeyError(f"key {key!r} is not tracked") from None

    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        slot = len(self._keys)
        if slot > SLOT_MASK:
            raise OverflowError(f"more than {SLOT_MASK} slots")
        self._keys.append(_FREE)
        self._parent.append(-1)
        self._children.append(0)
        self._pins.append(0)
        self._in_heap.append(0)
        self._retention.append(_NORMAL)
        self._grow()
        return slot

    def _release(self, slot: int) -> None:
        self._keys[slot] = _FREE
        self._in_heap[slot] = 0
        self._free.append(slot)

    def _detach(self, slot: int) -> None:
        """Unlink `slot` from its parent; the parent may become a candidate victim."""
        pslot = self._parent[slot]
        if pslot < 0:
            return
        self._parent[slot] = -1
        left = self._children[pslot] - 1
        self._children[pslot] = left
        if left == 0:
            if self._keys[pslot] is _TOMBSTONE:
                self._release(pslot)
            else:
                self._make_candidate(pslot)

    def _make_candidate(self, slot: int) -> None:
        """Push a key's live item if it is eligible and not in the heap yet."""
        if self._children[slot] or self._pins[slot] or self._in_heap[slot]:
            return
        item = self._index[self._keys[slot]]
        heapq.heappush(self._side if item < 0 else self._heap, item)
        self._in_heap[slot] = 1

    def _accessed(self, slot: int) -> None:
        """The end of every `insert` and `touch` (`slot` is the key's): rebuild the heap when
        garbage is due. A policy that watches accesses (`auto`) overrides it, so its own
        work costs no call layer around `insert` and `touch`."""
        if len(self._heap) > COMPACT_FACTOR * len(self._index) + COMPACT_SLACK:
            self._compact()  # `_maybe_compact` written out: one call per access, not two

    def _maybe_compact(self) -> None:
        if len(self._heap) > COMPACT_FACTOR * len(self._index) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        children = self._children
        pins = self._pins
        in_heap = self._in_heap
        heap: list[int] = []
        side: list[int] = []
        for item in self._index.values():
            slot = item & SLOT_MASK
            if children[slot] or pins[slot]:
                in_heap[slot] = 0
            else:
                in_heap[slot] = 1
                (side if item < 0 else heap).append(item)
        heapq.heapify(heap)
        heapq.heapify(side)
        self._heap = heap
        self._side = side
        self._compactions += 1
