"""`belady`: the offline optimum (MIN with bypass), for simulations only.

Knowing the whole trace, the policy evicts the block whose next use is farthest in
the future (never used again counts as farthest; ties go to the least recently used).
The simulator also lets it decline to store a block whose next use is farther than
every evictable block's ("bypass"), which makes it an upper bound for admission
filters too. Chain consistency costs it nothing: a request that uses a block uses its
whole prefix, so a parent's next use is never later than its child's, and the farthest
next use is always reached at a leaf.

The clock must be the request index: the simulator ticks once per request, so while
request r is served `now == r`, and a block's next use is its first request after r.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Sequence

from ..chainheap import SEQ_BITS, ChainHeapPolicy

__all__ = ["BeladyPolicy"]

_NEVER = 1 << 48


class BeladyPolicy(ChainHeapPolicy):
    """Evict the block used farthest in the future; needs the future up front."""

    name = "belady"

    def __init__(self, uses: dict[Hashable, list[int]]) -> None:
        """`uses[key]`: sorted request indices that contain `key`."""
        super().__init__()
        self._future = uses

    @classmethod
    def for_requests(cls, blocks_per_request: Iterable[Sequence[Hashable]]) -> BeladyPolicy:
        """Build the oracle from each request's block hashes, in trace order."""
        uses: dict[Hashable, list[int]] = {}
        for index, blocks in enumerate(blocks_per_request):
            for key in blocks:
                seen = uses.setdefault(key, [])
                if not seen or seen[-1] != index:
                    seen.append(index)
        return cls(uses)

    def next_use(self, key: Hashable) -> int:
        """Index of the next request after now that uses `key` (large if none)."""
        times = self._future.get(key, ())
        i = bisect.bisect_right(times, self._now)
        return times[i] if i < len(times) else _NEVER

    def _grow(self) -> None:
        pass

    def _priority(self, slot: int, seq: int) -> int:
        return ((_NEVER - self.next_use(self._keys[slot])) << SEQ_BITS) | seq

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        return self._priority(slot, seq)

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        return self._priority(slot, seq)
