"""A bounded memory of recently evicted keys: two generations of a blocked Bloom filter.

`auto`'s doorkeeper rules ask one question at insert: has this key been cached before
(within the last few cache turnovers)? Keeping the keys themselves would cost a dict entry
per remembered key; this filter costs 2 bytes per remembered key in each generation and
one byte probe per operation: a key sets 2 of the 8 bits of one byte chosen by its hash
(a Bloom filter blocked to one byte, Putze et al., "Cache-, hash- and space-efficient
bloom filters", WEA '07). A key added is remembered until at least `window` further keys
have been added (at most `2 x window`): when the current generation has taken `window`
keys it becomes the old one and the previous old one is dropped. A never-seen key is
reported as seen with probability about 3.5% per full generation (7% when both are full,
measured); that only makes the doorkeeper treat a one-shot key like a repeated one, as
LRU treats every key. Dropping a generation allocates a new one: one O(window) step per
`window` additions, amortized like the heap rebuild of `chainheap.py`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["Ghost", "probe"]

BYTES_PER_KEY = 2
"""Filter bytes per key of one generation."""
MULT = 0xD6E8FEB86659FD93  # differs from the shadow-sampling multiplier in auto.py
MASK64 = (1 << 64) - 1


class Ghost:
    """Remembers the last `window` to `2 x window` keys added (approximately, see above).

    `generations` is [current, old], replaced in place, so a caller may keep the list and
    probe it with `probe`, as the doorkeeper's insert path does (no `in` dispatch).
    """

    __slots__ = ("_taken", "generations", "size", "window")

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1; got {window}")
        self.window = window
        self.size = BYTES_PER_KEY * window
        """Bytes per generation."""
        self.generations = [bytearray(self.size), bytearray(self.size)]
        self._taken = 0

    def add(self, key: Hashable) -> None:
        self.add_all((key,))

    def add_all(self, keys: Iterable[Hashable]) -> None:
        """`add` each of `keys`, in order."""
        generations = self.generations
        current = generations[0]
        size = self.size
        window = self.window
        taken = self._taken
        for key in keys:
            h = (hash(key) * MULT) & MASK64
            current[h % size] |= (1 << (h >> 61)) | (1 << ((h >> 58) & 7))
            taken += 1
            if taken >= window:
                generations[1] = current
                generations[0] = current = bytearray(size)
                taken = 0
        self._taken = taken

    def __contains__(self, key: object) -> bool:
        return probe(self.generations, self.size, key)


def probe(generations: list[bytearray], size: int, key: object) -> bool:
    """Whether `key` is (probably) in a ghost with these `generations` of `size` bytes."""
    h = (hash(key) * MULT) & MASK64
    i = h % size
    bits = (1 << (h >> 61)) | (1 << ((h >> 58) & 7))
    current, old = generations
    return current[i] & bits == bits or old[i] & bits == bits
