"""Hit and transfer counters of the connector, and the log lines users grep for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from kvpool_mmap import StoreStats


@dataclass
class HitCounters:
    """Cumulative counters, kept on the scheduler side."""

    requests: int = 0
    lookup_tokens: int = 0
    hit_tokens_l1: int = 0
    hit_tokens_l2: int = 0
    requests_hit_l1_only: int = 0
    requests_hit_l2_only: int = 0
    requests_hit_mixed: int = 0
    loaded_blocks: int = 0
    stored_blocks: int = 0
    l2_skipped_blocks: int = 0

    def record_lookup(self, prompt_tokens: int) -> None:
        """Count one request's first lookup."""
        self.requests += 1
        self.lookup_tokens += prompt_tokens

    def record_hit(self, *, block_size: int, l1: int, l2: int) -> None:
        """Count a load: `l1` and `l2` blocks served beyond what vLLM's own cache had."""
        self.hit_tokens_l1 += l1 * block_size
        self.hit_tokens_l2 += l2 * block_size
        if l1 and l2:
            self.requests_hit_mixed += 1
        elif l1:
            self.requests_hit_l1_only += 1
        elif l2:
            self.requests_hit_l2_only += 1

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def hit_line(self) -> str:
        """The `[CPU-OFFLOAD HIT]` line: token and request hit rates, split by tier."""
        total = max(self.lookup_tokens, 1)
        hits = self.requests_hit_l1_only + self.requests_hit_l2_only + self.requests_hit_mixed
        return (
            f"[CPU-OFFLOAD HIT] requests={self.requests} "
            f"request_hit_rate={100.0 * hits / max(self.requests, 1):.1f}% "
            f"(l1_only={self.requests_hit_l1_only} l2_only={self.requests_hit_l2_only} "
            f"mixed={self.requests_hit_mixed}) "
            f"token_hit_rate={100.0 * (self.hit_tokens_l1 + self.hit_tokens_l2) / total:.1f}% "
            f"(l1={100.0 * self.hit_tokens_l1 / total:.1f}% "
            f"l2={100.0 * self.hit_tokens_l2 / total:.1f}%) "
            f"hit_tokens={self.hit_tokens_l1 + self.hit_tokens_l2} "
            f"lookup_tokens={self.lookup_tokens} "
            f"l2_skipped_blocks={self.l2_skipped_blocks}"
        )


def store_counters(stats: StoreStats) -> dict[str, int]:
    """The store's cumulative counters under the connector's metric names."""
    return {
        "evictions_l1": stats.l1_evictions,
        "evictions_l2": stats.l2_evictions,
        "demotes": stats.demotions,
        "promotes": stats.promotions,
        "checksum_failures": stats.checksum_failures,
        "not_stored": stats.store_no_space,
    }


def eviction_line(stats: StoreStats) -> str:
    """The `Marconi eviction: stats=` line.

    tracked = blocks the eviction policies track over both tiers (a block held in L1 and
    written through to L2 counts in each); hoisted = blocks chosen as L1 victims;
    checksum_failures = L2 blocks that failed verification and were treated as misses;
    not_stored = blocks offered for storing that found no free L1 slot (every L1 block is
    pinned by a load or waits for its L2 write: stores outpace L2's write bandwidth).
    """
    return (
        f"Marconi eviction: stats=tracked={stats.l1_used + stats.l2_used} "
        f"l1={stats.l1_used} l2={stats.l2_used} demotes={stats.demotions} "
        f"promotes={stats.promotions} hoisted={stats.l1_evictions} "
        f"checksum_failures={stats.checksum_failures} not_stored={stats.store_no_space}"
    )


class StatsReporter:
    """What the connector reports, from cumulative counters: the increments since the
    last report (vLLM's KV-connector stats) and, every `hit_log_interval` lookups, the
    hit and eviction log lines."""

    def __init__(
        self,
        counters: HitCounters,
        store_stats: Callable[[], StoreStats],
        hit_log_interval: int,
    ) -> None:
        self._counters = counters
        self._store_stats = store_stats
        self._interval = hit_log_interval
        self._reported: dict[str, int] = {}
        self._hit_lines_logged = 0

    def due_log_lines(self) -> list[str]:
        """The hit and eviction lines when another `hit_log_interval` lookups were
        counted since the last ones, else nothing."""
        intervals = self._counters.requests // self._interval
        if intervals <= self._hit_lines_logged:
            return []
        self._hit_lines_logged = intervals
        return [self._counters.hit_line(), eviction_line(self._store_stats())]

    def delta(self) -> dict[str, int]:
        """Counters that grew since the last call, by how much (nothing when none did)."""
        now = {**self._counters.as_dict(), **store_counters(self._store_stats())}
        delta = {key: value - self._reported.get(key, 0) for key, value in now.items()}
        self._reported.update(now)
        return {key: value for key, value in delta.items() if value}
