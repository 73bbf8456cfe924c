"""Plain data that crosses the store's boundary: tiers, tickets, statistics."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Tier(enum.IntEnum):
    """Where a cached block can be read from now."""

    L1 = 1
    L2 = 2


class LoadStatus(enum.Enum):
    """State of a load ticket."""

    PENDING = "pending"
    """Promotions from L2 are still running."""
    READY = "ready"
    """Every block is in L1 at ticket.l1_slots and pinned until end_load."""
    FAILED = "failed"
    """At least one block could not be provided (ticket.failed); the others are ready."""


@dataclass(eq=False)
class LoadTicket:
    """A load in progress (from begin_load). Read-only for the caller."""

    id: int
    keys: list[bytes]
    """The blocks this load covers (the longest cached prefix of the request)."""
    tiers: list[Tier]
    """Where each block was when the load began (L2 ones are being promoted)."""
    l1_slots: list[int]
    """L1 slot of each block; valid for blocks not in `failed` once the ticket is done."""
    failed: list[bytes] = field(default_factory=list)
    """Blocks that could not be provided (checksum mismatch, I/O error, no L1 space)."""
    pending: int = 0
    """Promotions still running."""
    closed: bool = False
    started: float = 0.0
    """time.monotonic() at begin_load."""
    promoted_at: float = 0.0
    """time.monotonic() when its last promotion finished on the I/O threads (0: none)."""
    cached_promotions: int = 0
    """Promoted blocks whose L2 read may have come from the page cache (L2 without O_DIRECT,
    the block written or read since the last cache drop): fast whatever the disk is, so
    promotion_seconds says nothing about the disk for them."""

    @property
    def promotion_seconds(self) -> float:
        """Time its L2 blocks took to reach L1, scheduler polling excluded (0: none)."""
        return max(self.promoted_at - self.started, 0.0) if self.promoted_at else 0.0

    @property
    def ready_prefix(self) -> int:
        """Number of leading blocks that are (or will be, once done) loaded correctly."""
        bad = set(self.failed)
        for i, k in enumerate(self.keys):
            if k in bad:
                return i
        return len(self.keys)


@dataclass(eq=False)
class StoreTicket:
    """An allocation for blocks the worker is about to write (from begin_store)."""

    id: int
    keys: list[bytes]
    l1_slots: list[int | None]
    """Slot to write for each key; None where the key was not admitted, is already
    stored, or no L1 slot could be freed."""
    parents: list[bytes | None]
    depths: list[int]
    done: bool = False

    @property
    def allocated(self) -> list[tuple[bytes, int]]:
        """(key, slot) pairs the worker must write."""
        return [(k, s) for k, s in zip(self.keys, self.l1_slots, strict=True) if s is not None]


@dataclass(frozen=True)
class StoreStats:
    """Counters and gauges of a TieredStore."""

    l1_slots: int
    l1_used: int
    l1_free: int
    l2_slots: int
    l2_used: int
    l2_free: int
    lookups: int
    l1_hits: int
    l2_hits: int
    stores: int
    not_admitted: int
    store_no_space: int
    promotions: int
    demotions: int
    write_throughs: int
    write_through_queued: int
    write_through_skipped: int
    l1_evictions: int
    l2_evictions: int
    checksum_failures: int
    io_errors: int
    load_failures: int
    dropped_unwritten: int
    """L1 victims dropped without an L2 copy because L2 writes were behind
    (l1_overflow='drop_unwritten')."""
    restores: int
    """Blocks stored into L1 again while their L2 copy was there (begin_store of a key
    found only in L2, e.g. recomputed because loading it was not worth it)."""
    inflight_io: int
    recovered_blocks: int
    recovery_discarded: int
    disabled: int
    """1 if the store turned itself off (an L1 file was re-created under it; see logs)."""
