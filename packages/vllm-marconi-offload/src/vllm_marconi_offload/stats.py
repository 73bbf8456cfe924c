"""Hit and transfer counters of the connector, and the log lines users grep for."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field

from kvpool_mmap import RecoveryReport, StoreConfig, StoreStats


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
        "dropped_unwritten": stats.dropped_unwritten,
        "restores": stats.restores,
    }


def eviction_line(stats: StoreStats) -> str:
    """The `Marconi eviction: stats=` line.

    tracked = blocks the eviction policies track over both tiers (a block held in L1 and
    written through to L2 counts in each); hoisted = blocks chosen as L1 victims;
    checksum_failures = L2 blocks that failed verification and were treated as misses;
    not_stored = blocks offered for storing that found no free L1 slot (every L1 block is
    pinned by a load or waits for its L2 write: with l1_overflow="demote", stores outpace
    L2's write bandwidth); dropped_unwritten = L1 victims dropped before their L2 copy
    was written (l1_overflow="drop_unwritten" with L2 writes behind); restores = blocks
    stored into L1 again while L2 held them (recomputed instead of loaded, under
    "drop_unwritten").
    """
    return (
        f"Marconi eviction: stats=tracked={stats.l1_used + stats.l2_used} "
        f"l1={stats.l1_used} l2={stats.l2_used} demotes={stats.demotions} "
        f"promotes={stats.promotions} hoisted={stats.l1_evictions} "
        f"checksum_failures={stats.checksum_failures} not_stored={stats.store_no_space} "
        f"dropped_unwritten={stats.dropped_unwritten} restores={stats.restores}"
    )


def occupancy(stats: StoreStats, config: StoreConfig) -> dict[str, int]:
    """Blocks and bytes held and available per tier (a block spans every TP rank's slot)."""
    block_bytes = config.stride * config.tp_size
    return {
        "l1_used_blocks": stats.l1_used,
        "l1_used_bytes": stats.l1_used * block_bytes,
        "l1_capacity_blocks": stats.l1_slots,
        "l1_capacity_bytes": stats.l1_slots * block_bytes,
        "l2_used_blocks": stats.l2_used,
        "l2_used_bytes": stats.l2_used * block_bytes,
        "l2_capacity_blocks": stats.l2_slots,
        "l2_capacity_bytes": stats.l2_slots * block_bytes,
    }


def recovery_line(report: RecoveryReport, l2_path: object) -> str:
    """The startup line saying what the L2 pool kept from the previous run, and why not more."""
    dropped = report.corrupt_headers + report.incomplete + report.duplicates + report.bad_payloads
    return (
        f"L2 recovery: {len(report.blocks)} blocks recovered from {l2_path}, {dropped} dropped "
        f"(torn_headers={report.corrupt_headers} incomplete_across_ranks={report.incomplete} "
        f"older_duplicates={report.duplicates} bad_checksums={report.bad_payloads}); "
        f"rank files wiped for another model/layout: {report.wiped_files}"
    )


@dataclass
class TransferTimer:
    """Seconds from a transfer's start to its completion, for `load` and `store`; the
    durations wait in `samples` until `take` hands them to the metrics."""

    clock: Callable[[], float] = time.monotonic
    samples: dict[str, list[float]] = field(default_factory=lambda: {"load": [], "store": []})
    _started: dict[tuple[str, Hashable], float] = field(default_factory=dict)

    def start(self, kind: str, job: Hashable) -> None:
        self._started[(kind, job)] = self.clock()

    def finish(self, kind: str, job: Hashable) -> None:
        """Record the duration of a started transfer; no-op for one not started."""
        started = self._started.pop((kind, job), None)
        if started is not None:
            self.samples[kind].append(self.clock() - started)

    def forget(self, kind: str, job: Hashable) -> None:
        """Drop a transfer that will not complete (its request finished or was aborted)."""
        self._started.pop((kind, job), None)

    def take(self) -> dict[str, list[float]]:
        """The durations recorded since the last call, by kind (`load_seconds`, ...)."""
        taken = {f"{kind}_seconds": values for kind, values in self.samples.items() if values}
        self.samples = {kind: [] for kind in self.samples}
        return taken


@dataclass
class ReportedStats:
    """What the last report said, so the next one sends only what changed."""

    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int] = field(default_factory=dict)

    def changes(self, counters: dict[str, int], gauges: dict[str, int]) -> dict[str, int]:
        """Counter increments and gauge values that differ from the last report."""
        data = {k: v - self.counters.get(k, 0) for k, v in counters.items()}
        data = {k: v for k, v in data.items() if v}
        data.update({k: v for k, v in gauges.items() if self.gauges.get(k) != v})
        self.counters.update(counters)
        self.gauges.update(gauges)
        return data


class StatsReporter:
    """What the connector reports from the scheduler side: counter increments, gauges that
    changed and transfer durations since the last report (vLLM's KV-connector stats), and,
    every `hit_log_interval` lookups, the hit and eviction log lines."""

    def __init__(
        self,
        counters: HitCounters,
        timer: TransferTimer,
        store_stats: Callable[[], StoreStats],
        store_config: StoreConfig,
        hit_log_interval: int,
    ) -> None:
        self._counters = counters
        self._timer = timer
        self._store_stats = store_stats
        self._store_config = store_config
        self._interval = hit_log_interval
        self._reported = ReportedStats()
        self._hit_lines_logged = 0

    def due_log_lines(self) -> list[str]:
        """The hit and eviction lines when another `hit_log_interval` lookups were
        counted since the last ones, else nothing."""
        intervals = self._counters.requests // self._interval
        if intervals <= self._hit_lines_logged:
            return []
        self._hit_lines_logged = intervals
        return [self._counters.hit_line(), eviction_line(self._store_stats())]

    def report(self) -> dict[str, int | list[float]]:
        """What changed since the last call (see the class docstring)."""
        stats = self._store_stats()
        data: dict[str, int | list[float]] = {}
        data.update(
            self._reported.changes(
                counters={**self._counters.as_dict(), **store_counters(stats)},
                gauges=occupancy(stats, self._store_config),
            )
        )
        data.update(self._timer.take())
        return data
