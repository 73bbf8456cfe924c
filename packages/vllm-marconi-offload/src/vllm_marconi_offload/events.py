"""What the store's tiers can load, as a stream of changes for KV-aware routers.

`TierEvents` listens to the store (`TieredStore.tier_listener`) and queues, in order, one
change per block and tier: stored (loadable from now on) or removed (no longer), plus a
`CLEARED` marker ahead of a full re-announcement (at start, after a reset). It keeps what
makes each event self-describing (vLLM's parent hash, token ids, extra keys) for every
block some tier holds, since a removal or a demotion happens long after the request that
computed the block has gone. `kv_events.py` turns the changes into vLLM's event classes.

Built only when vLLM's KV events are on: without it, the store calls no listener and the
scheduler records nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvpool_mmap import Tier
from vllm_kv_identity import GROUP_ID_BYTES

from .block_info import BlockInfo

if TYPE_CHECKING:
    from .journal import DescriptionJournal

TIERS = (Tier.L1, Tier.L2)


@dataclass(frozen=True, slots=True)
class Change:
    """One change of what a tier can load; `tier` None with `loadable` False: everything
    this engine announced before is gone (a fresh announcement follows)."""

    key: bytes
    tier: Tier | None
    loadable: bool
    info: BlockInfo | None = None


CLEARED = Change(b"", None, False)


def block_hash(key: bytes) -> bytes:
    """vLLM's block hash inside a store key (`vllm_kv_identity.block_key`)."""
    return key[:-GROUP_ID_BYTES]


class TierEvents:
    """Queues each tier's changes; remembers the blocks' descriptions while a tier holds them.

    Scheduler-side, single-threaded (the store calls `on_change` on its owner thread).
    """

    def __init__(self, describe: Callable[[Any, int], BlockInfo]) -> None:
        """`describe(request, index)`: block `index` of a live vLLM request's description."""
        self._describe = describe
        self._info: dict[bytes, BlockInfo] = {}
        self._held: dict[Tier, set[bytes]] = {tier: set() for tier in TIERS}
        self._changes: list[Change] = []
        self._journal: DescriptionJournal | None = None

    def keep_descriptions(self, journal: DescriptionJournal) -> None:
        """Describe the blocks L2 recovered from `journal` and write each block L2 takes
        from now on to it, so a restart announces L2 self-describing."""
        self._info.update(journal.load(self._held[Tier.L2]))
        self._journal = journal
        self._compact()

    def record(self, request: Any, key: bytes, index: int) -> None:
        """Remember what `key`, block `index` of `request`, is (while the request is
        alive: a store of it was planned, or it is part of a hit)."""
        if key not in self._info:
            self._info[key] = self._describe(request, index)

    def forget_unheld(self, keys: Iterable[bytes]) -> None:
        """Drop descriptions of keys no tier took (a store that was aborted)."""
        for key in keys:
            if not self._is_held(key):
                self._info.pop(key, None)

    def on_change(self, key: bytes, tier: Tier, loadable: bool) -> None:
        """The store's `tier_listener`: queue a change that tells something new."""
        held = self._held[tier]
        if loadable == (key in held):
            return  # repeated, or the removal of a copy never announced (a failed write)
        if loadable:
            held.add(key)
        else:
            held.discard(key)
        self._changes.append(Change(key, tier, loadable, self._info.get(key)))
        if not loadable and not self._is_held(key):
            self._info.pop(key, None)

    def announce_all(self) -> None:
        """Queue `CLEARED` and then every block each tier holds (the engine started, or
        its cache was reset while some blocks were in use)."""
        self._changes.append(CLEARED)
        for tier in TIERS:
            for key in self._held[tier]:
                self._changes.append(Change(key, tier, True, self._info.get(key)))

    def adopt(self, tier: Tier, keys: Iterable[bytes]) -> None:
        """Blocks `tier` already holds (L2 after a restart): held, announced by
        `announce_all`."""
        self._held[tier].update(keys)

    def take(self) -> list[Change]:
        """The changes queued since the last call, oldest first."""
        changes, self._changes = self._changes, []
        if self._journal is not None:
            self._journal.append(
                (c.key, c.info)
                for c in changes
                if c.tier is Tier.L2 and c.loadable and c.info is not None
            )
            if self._journal.lines > 2 * len(self._held[Tier.L2]) + 4096:
                self._compact()
        return changes

    def close(self) -> None:
        """The store closed: journal its last L2 writes (no event is published now)."""
        if self._journal is not None:
            self.take()
            self._journal.close()

    def _compact(self) -> None:
        """Rewrite the journal with the blocks L2 holds now."""
        assert self._journal is not None
        held = self._held[Tier.L2]
        self._journal.rewrite((k, self._info[k]) for k in held if k in self._info)

    def held(self, tier: Tier) -> set[bytes]:
        """Keys `tier` holds as far as the changes so far tell (for checks)."""
        return set(self._held[tier])

    def _is_held(self, key: bytes) -> bool:
        return any(key in self._held[tier] for tier in TIERS)
