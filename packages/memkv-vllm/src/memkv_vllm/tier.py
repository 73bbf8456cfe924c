"""`MemKVTierManager`: a shared store as a secondary tier of vLLM's `TieringOffloadingSpec`.

Runs in the scheduler (EngineCore) process. vLLM keeps the CPU pool as the primary tier;
this tier sees one value per (block hash, KV cache group): the full CPU-pool row of the
chunk (every TP rank's bytes, `stride` bytes). Stores and loads read and write the
pool's rows in place through the store interface (`.store`: MemKV or Mooncake
Store, chosen by `.store.StoreConfig`).

Every vLLM-facing method is a short delegation: lookups to `.scheduler_lookup`,
transfers to `.jobs.JobRunner`, names to `.naming.TierNamer`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from vllm_kv_identity import weights_fingerprint

from . import _compat as c
from .config import TierConfig
from .jobs import JobOutcome, JobRunner
from .kv_events import SharedTierEvents
from .lookup import BatchedLookup
from .metrics import (
    BLOCKS,
    JOB_SECONDS,
    JOBS_FAILED,
    LOAD_BYTES,
    STORE_BYTES,
    STORE_SHEDS,
    UNAVAILABLE,
    TierMetrics,
    metric_definitions,
)
from .naming import TierNamer
from .scheduler_lookup import SchedulerLookup
from .store import ItemOutcome, StoreConfig, open_store, store_keys

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import (
        LookupResult,
        Medium,
        OffloadingMetricMetadata,
        OffloadingSpec,
        OffloadKey,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )
    from vllm.v1.kv_offload.tiering.base import JobResult

__all__ = ["MemKVTierManager", "memkv"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


def _chunks(items: list[int], size: int) -> Iterable[list[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MemKVTierManager(c.SecondaryTierManager):  # type: ignore[misc]
    """A `secondary_tiers` entry `{"type": "memkv", ...}`; keys in `TierConfig`."""

    # STORAGE, as vLLM's own fs/obj tiers: what `kv_load_tiers` and the KV events name
    medium: ClassVar[Medium | None] = c.MEDIUM_STORAGE
    cache_hit_source: ClassVar[Any] = c.HIT_SOURCE_REMOTE  # `CacheHitSource`: vLLM >= 0.32 only

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,  # `BackpressureDetector`: vLLM >= 0.31
        **tier_config: Any,
    ) -> None:
        c.init_tier_base(self, offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.cfg = TierConfig.from_dict(tier_config)
        store_config = StoreConfig.resolve(
            {k: v for k, v in tier_config.items() if k in store_keys("")}, "secondary_tiers[memkv]"
        )
        c.set_remote_locality(self, tier_config.get("locality"))
        self._rows = np.asarray(primary_kv_view)  # zero-copy: the mmap'd CPU pool
        assert self._rows.ndim == 2, self._rows.shape
        self._row_bytes = int(self._rows.strides[0])
        model = offloading_spec.config.model.name
        self.fingerprint = weights_fingerprint(model)
        self._namer = TierNamer(
            c.make_file_mapper(self.cfg.prefix, offloading_spec), self.fingerprint
        )
        c.warn_if_hashes_differ_per_process()
        self._kv = open_store(store_config, self.cfg.probe_servers, "tier")
        self._kv.register(self._rows)  # the CPU pool: zero-copy transfers where possible
        progress = threading.Event()
        self._lookup = BatchedLookup(
            self._kv.exists,
            hit_ttl=self.cfg.lookup_hit_ttl_s,
            miss_ttl=self.cfg.lookup_miss_ttl_s,
            timeout=min(self.cfg.lookup_timeout_s, store_config.stall_budget_s),
            settings_hint=self._kv.settings_hint,
            progress=progress,
        )
        self._metrics = TierMetrics()
        self._jobs = JobRunner(
            self.cfg.n_read_threads,
            self.cfg.n_write_threads,
            self.cfg.max_store_backlog_mb << 20,
            progress,
        )
        self._lookups = SchedulerLookup(
            self._lookup, self._metrics, progress, self._kv.health, self._jobs.pending
        )
        self._events = SharedTierEvents() if c.events_enabled(offloading_spec) else None
        self._write_config_record(offloading_spec)
        log.info(
            "memkv-vllm: tier ready: %d-byte values under %s on %s (vLLM %s)",
            self._row_bytes, self._namer.run_folder, self._kv.describe(), c.vllm_version(),
        )  # fmt: skip

    def _write_config_record(self, spec: OffloadingSpec) -> None:
        record = {
            "fields": c.make_file_mapper(self.cfg.prefix, spec).get_run_config(),
            "weights_fingerprint": self.fingerprint,
            "value_bytes": self._row_bytes,
            "vllm": c.vllm_version(),
        }
        try:
            self._kv.put_record(self._namer.config_record_name(), json.dumps(record).encode())
        except Exception as exc:  # informational only
            log.warning("memkv-vllm: could not write the run's config record: %s", exc)

    # --- lookups ------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        answer = self._lookup.query(self._namer.name(key))
        if self._events is not None:
            self._events.on_lookup(key, answer)
        return self._lookups.result(answer)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.on_schedule_end()

    # --- transfers ----------------------------------------------------------------------

    # job_metadata: `TransferJob` from vLLM 0.28, `JobMetadata` before (see `_compat`)
    def submit_store(self, job_metadata: Any) -> None:
        keys = list(job_metadata.keys)
        slots = c.job_slots(job_metadata)
        names = [self._namer.name(k) for k in keys]
        if not self._jobs.submit_store(
            job_metadata.job_id,
            len(keys) * self._row_bytes,
            lambda: self._store(keys, names, slots),
        ):
            self._metrics.inc(STORE_SHEDS)

    def _store(self, keys: list[OffloadKey], names: list[bytes], slots: np.ndarray) -> JobOutcome:
        # values are content-addressed: skip what another instance already stored
        present = self._kv.exists(names)
        ok = {i for i, p in enumerate(present) if p}
        todo = [i for i, p in enumerate(present) if not p]
        sent = dropped = 0
        for part in _chunks(todo, self.cfg.blocks_per_op):
            items = [(names[i], self._rows[slots[i]], self._row_bytes) for i in part]
            for i, result in zip(part, self._kv.batch_put(items), strict=True):
                if result.ok:
                    ok.add(i)
                    sent += self._row_bytes
                dropped += result.unavailable
        self._lookup.mark([names[i] for i in ok], True)
        self._metrics.inc(UNAVAILABLE, dropped, ("store",))
        self._metrics.inc(STORE_BYTES, sent)
        self._metrics.inc(BLOCKS, len(todo), ("store",))
        return JobOutcome(
            success=len(ok) == len(keys), ok_keys=[keys[i] for i in sorted(ok)], nbytes=sent
        )

    def submit_load(self, job_metadata: Any) -> None:  # `Any`: as `submit_store`
        keys = list(job_metadata.keys)
        slots = c.job_slots(job_metadata)
        names = [self._namer.name(k) for k in keys]
        self._jobs.submit_load(job_metadata.job_id, lambda: self._load(keys, names, slots))

    def _load(self, keys: list[OffloadKey], names: list[bytes], slots: np.ndarray) -> JobOutcome:
        ok: list[int] = []
        gone: list[int] = []
        stalled: dict[int, ItemOutcome] = {}
        for part in _chunks(list(range(len(keys))), self.cfg.blocks_per_op):
            items = [(names[i], self._rows[slots[i]], self._row_bytes) for i in part]
            for i, result in zip(part, self._kv.batch_get_into(items), strict=True):
                if result.ok:
                    ok.append(i)
                elif result.unavailable:
                    stalled[i] = result
                else:
                    gone.append(i)
        if gone:
            # gone between lookup and load (evicted, server restarted): read as absent for
            # a while so vLLM recomputes instead of asking again
            self._lookup.mark([names[i] for i in gone], False, self.cfg.load_failure_ttl_s)
            log.warning(
                "memkv-vllm: %d of %d chunks could not be loaded (first: %s); vLLM recomputes",
                len(gone), len(keys), names[gone[0]].decode(errors="replace"),
            )  # fmt: skip
        if stalled:
            # still stored, most likely: absent only until the next lookup asks again
            self._lookup.mark([names[i] for i in stalled], False)
            self._metrics.inc(UNAVAILABLE, len(stalled), ("load",))
            first = next(iter(stalled.values()))
            log.warning(
                "memkv-vllm: %d of %d chunks not loaded: member %s timed out or is down "
                "(%s); vLLM recomputes them", len(stalled), len(keys), first.member, first.cause,
            )  # fmt: skip
        failed = gone + list(stalled)
        nbytes = len(ok) * self._row_bytes
        self._metrics.inc(LOAD_BYTES, nbytes)
        self._metrics.inc(BLOCKS, len(ok), ("load",))
        return JobOutcome(
            success=not failed,
            ok_keys=[keys[i] for i in ok],
            failed_keys=[keys[i] for i in failed],
            nbytes=nbytes,
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for done in self._jobs.finished():
            op = "load" if done.is_load else "store"
            outcome = done.outcome
            if done.shed:
                results.append(c.make_job_result(done.job_id, False))
                continue
            if "error" in done.extra:
                log.error("memkv-vllm: %s job %d raised %s", op, done.job_id, done.extra["error"])
            self._metrics.observe(JOB_SECONDS, done.seconds, (op,))
            if not outcome.success:
                self._metrics.inc(JOBS_FAILED, 1, (op,))
            if self._events is not None:
                self._events.on_job(done.is_load, outcome.ok_keys, outcome.failed_keys)
            results.append(
                c.make_job_result(
                    done.job_id,
                    outcome.success,
                    successful_keys=outcome.ok_keys if done.is_load else None,
                    transfer_time=done.seconds,
                    transfer_bytes=outcome.nbytes,
                )
            )
        return results

    def drain_jobs(self) -> None:
        self._jobs.drain()

    def has_pending_work(self) -> bool:
        return self._lookups.pending() or self._jobs.pending()

    # --- per-request hooks (nothing to keep per request) --------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return c.RequestOffloadingContext()

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[Any]:
        """What this engine stored to and found in the shared store (`.kv_events`)."""
        return self._events.take() if self._events is not None else ()

    # --- stats and lifetime -------------------------------------------------------------

    def get_stats(self) -> OffloadingConnectorStats | None:
        return self._lookups.take_stats()

    def shutdown(self) -> None:
        self._jobs.drain(timeout=30)
        self._jobs.shutdown()
        self._lookups.close()
        self._kv.close()


memkv = MemKVTierManager  # `{"type": "memkv", "module_path": "memkv_vllm.tier"}` (vLLM >= 0.28)
