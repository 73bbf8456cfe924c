"""The in-memory index: one entry per cached key, its slots and their states; free lists.

Pure bookkeeping, no I/O, no threads: only the store's owner thread touches it.
"""

from __future__ import annotations

import enum

import numpy as np
from kv_eviction.retention import Retention


class SlotState(enum.IntEnum):
    """State of a key's copy in one tier."""

    NONE = 0
    WRITING = 1
    """L1: allocated by begin_store, the worker is writing it. L2: a write is in flight."""
    FILLING = 2
    """L1 only: a promotion from L2 is in flight."""
    VALID = 3


class Entry:
    """Where one key lives. Pins count users of a copy (loads, transfers reading it)."""

    __slots__ = (
        "depth",
        "evicting",
        "key",
        "l1",
        "l1_jobs",
        "l1_pins",
        "l1_state",
        "l2",
        "l2_pins",
        "l2_read_cached",
        "l2_state",
        "l2_touched",
        "parent",
        "retention",
        "wt_queued",
    )

    def __init__(self, key: bytes, parent: bytes | None, depth: int) -> None:
        self.key = key
        self.parent = parent
        self.depth = depth
        self.l1 = -1
        self.l1_state = SlotState.NONE
        self.l1_pins = 0
        self.l1_jobs = 0
        """L2 writes in flight that read the L1 slot: it is neither freed nor reused
        until they finish, but (unlike a pin) they do not keep it from being a victim."""
        self.evicting = False
        """L1 copy chosen as a victim; its slot frees once no pin or L2 write holds it."""
        self.l2 = -1
        self.l2_state = SlotState.NONE
        self.l2_pins = 0
        self.l2_touched = float("-inf")
        """time.monotonic() when an I/O job last wrote or read the L2 copy."""
        self.l2_read_cached = False
        """The promotion in flight may be served from the page cache (BlockMover.may_be_cached)."""
        self.wt_queued = False
        self.retention = Retention.NORMAL
        """The storing request's hint: LOW is never written to L2 (nor recovered with a
        class: L2 keeps no hints, so recovered blocks are NORMAL)."""

    @property
    def l1_readable(self) -> bool:
        """A committed L1 copy exists (possibly being demoted)."""
        return self.l1_state == SlotState.VALID

    @property
    def l2_readable(self) -> bool:
        """A complete L2 copy exists."""
        return self.l2_state == SlotState.VALID

    @property
    def empty(self) -> bool:
        """No copy in either tier and no user: the entry can be forgotten."""
        return (
            self.l1_state == SlotState.NONE
            and self.l2_state == SlotState.NONE
            and self.l1_pins == 0
            and self.l1_jobs == 0
            and self.l2_pins == 0
        )


class FreeList:
    """Free slot numbers of one tier: a LIFO stack in a numpy array (8 bytes per slot),
    so recently used pages stay warm and millions of slots cost no Python objects."""

    def __init__(self, num_slots: int, used: set[int] | None = None) -> None:
        self.num_slots = num_slots
        self._stack = np.arange(num_slots - 1, -1, -1, dtype=np.int64)
        if used:
            keep = np.ones(num_slots, dtype=bool)
            keep[num_slots - 1 - np.fromiter(used, dtype=np.int64, count=len(used))] = False
            self._stack = np.ascontiguousarray(self._stack[keep])
            self._stack.resize(num_slots, refcheck=False)
        self._top = num_slots - len(used or ())

    def pop(self) -> int:
        """A free slot; IndexError if none."""
        if self._top == 0:
            raise IndexError("no free slot")
        self._top -= 1
        return int(self._stack[self._top])

    def push(self, slot: int) -> None:
        """Return a slot."""
        self._stack[self._top] = slot
        self._top += 1

    def __len__(self) -> int:
        return self._top

    def snapshot(self) -> list[int]:
        """The free slots (for checks and tests)."""
        return [int(x) for x in self._stack[: self._top]]


class L2Meta:
    """Per-L2-slot payload checksums (one per rank), kept in compact numpy arrays."""

    def __init__(self, num_slots: int, ranks: int) -> None:
        self.checksums = np.zeros((num_slots, ranks), dtype=np.uint64)

    def set(self, slot: int, checksums: list[int]) -> None:
        """Record the checksums of a freshly written or recovered slot."""
        self.checksums[slot] = checksums

    def get(self, slot: int) -> list[int]:
        """The checksums recorded for a slot."""
        return [int(c) for c in self.checksums[slot]]
