"""A slow, obviously-correct model of the policies, used as the oracle in tests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

SWITCH_EVERY_EPOCH: dict[str, Any] = {
    "sample_entries": 4,
    "min_shadow_keys": 1,
    "sample_budget": 16.0,
    "min_epoch": 8,
    "switch_margin": 0.0,
    "switch_sigmas": 0.0,
    "confirm_epochs": 1,
    "smoothing": 0.0,
    "min_discordant": 0,
}
"""`AutoPolicy` options that sample every key and switch on any lead, every 8 accesses:
the stress configuration of the tests that check victims while rules switch."""


@dataclass
class Entry:
    parent: object | None
    depth: int
    uses: int
    last_tick: int
    last_seq: int
    pins: int = 0


@dataclass
class ReferencePolicy:
    """Scores every eligible key from scratch on each query."""

    name: str
    decay: float = 0.0
    reuse_mode: str = "linear"
    entries: dict[object, Entry] = field(default_factory=dict)
    now: int = 0
    seq: int = 0

    def insert(self, key: object, parent: object | None, depth: int) -> None:
        self.seq += 1
        if parent not in self.entries:
            parent = None
        self.entries[key] = Entry(parent, depth, 1, self.now, self.seq)

    def touch(self, key: object) -> None:
        self.seq += 1
        entry = self.entries[key]
        entry.uses += 1
        entry.last_tick = self.now
        entry.last_seq = self.seq

    def remove(self, key: object) -> None:
        del self.entries[key]
        for entry in self.entries.values():
            if entry.parent == key:
                entry.parent = None

    def has_child(self, key: object) -> bool:
        return any(e.parent == key for e in self.entries.values())

    def eligible(self) -> list[object]:
        return [k for k, e in self.entries.items() if e.pins == 0 and not self.has_child(k)]

    def score(self, key: object) -> float:
        """The paper formula, or the recency stamp for LRU (lower = evicted first)."""
        e = self.entries[key]
        if self.name == "lru":
            return float(e.last_seq)
        reuse = {"linear": e.uses, "log": math.log1p(e.uses), "none": 1.0}[self.reuse_mode]
        return reuse * math.exp(-self.decay * (self.now - e.last_tick)) / (e.depth + 1)


def random_workload(
    policy: Any, ref: ReferencePolicy, steps: int, seed: int, *, returning_keys: bool = False
) -> None:
    """Random inserts (chains included), touches and evictions on `policy`, mirrored on
    `ref`; every victim must be one `ref` finds eligible (an unpinned leaf). With
    `returning_keys`, evicted keys come back half of the time."""
    rng = random.Random(seed)
    evicted: list[object] = []
    next_key = 0
    for _ in range(steps):
        r = rng.random()
        keys = list(ref.entries)
        if r < 0.4 or not keys:
            if returning_keys and evicted and rng.random() < 0.5:
                key: object = evicted.pop(rng.randrange(len(evicted)))
            else:
                key, next_key = next_key, next_key + 1
            parent = rng.choice(keys) if keys and rng.random() < 0.5 else None
            policy.insert(key, parent=parent)
            ref.insert(key, parent, 0)
        elif r < 0.7:
            policy.touch(rng.choice(keys))
        else:
            for victim in policy.pop_victims(rng.randint(1, 4)):
                assert victim in ref.eligible()
                ref.remove(victim)
                evicted.append(victim)
