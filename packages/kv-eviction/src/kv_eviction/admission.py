"""Admission filter: admit a block hash only once it has been seen `threshold` times.

Counting is exact but forgetful, in two generations of at most `max_entries // 2`
hashes each. A sighting goes into the current generation (carrying over the count the
hash had in the previous one); when the current generation is full it becomes the
previous one and the old previous one is dropped. Memory is therefore bounded by
`max_entries` hashes, and a flood of one-shot hashes can only push a hash out after
`max_entries // 2` other new hashes. Guarantee (no starvation): a hash seen `threshold`
times within any `max_entries // 2` consecutive observations is admitted.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["AdmissionTracker"]


class AdmissionTracker:
    """Counts sightings of hashes; `observe` says whether a hash is admitted."""

    def __init__(self, threshold: int = 1, max_entries: int = 1 << 20) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise ValueError(f"option 'admission_threshold' must be an int >= 1; got {threshold!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 2:
            raise ValueError(f"option 'max_entries' must be an int >= 2; got {max_entries!r}")
        self.threshold = threshold
        self.max_entries = max_entries
        self._generation = max_entries // 2
        self._current: dict[Hashable, int] = {}
        self._previous: dict[Hashable, int] = {}
        self.observed = 0
        self.admitted = 0

    def observe(self, key: Hashable) -> bool:
        """Record one sighting of `key`; True once it was seen >= threshold times."""
        self.observed += 1
        if self.threshold == 1:
            self.admitted += 1
            return True
        current = self._current
        count = current.get(key)
        if count is None:
            count = self._previous.pop(key, 0)
            if len(current) >= self._generation:
                self._previous = current
                current = self._current = {}
        count = min(count + 1, self.threshold)
        current[key] = count
        if count >= self.threshold:
            self.admitted += 1
            return True
        return False

    def count(self, key: Hashable) -> int:
        """Sightings of `key` still remembered (capped at the threshold)."""
        return self._current.get(key) or self._previous.get(key, 0)

    def __len__(self) -> int:
        """Hashes remembered now (at most `max_entries`)."""
        return len(self._current) + len(self._previous)
