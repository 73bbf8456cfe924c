"""`MarconiOffloadConnector`: vLLM's KV connector interface, delegating to one side.

vLLM builds one instance with the SCHEDULER role in the engine-core process and one with
the WORKER role in each worker; each delegates to `OffloadScheduler` or `OffloadWorker`.
"""

from __future__ import annotations

from typing import Any

from kvpool_mmap import TieredStore
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from . import compat
from .config import OffloadConfig, user_keys
from .cost import LoadCostModel
from .keys import restart_hash_problem
from .layout import SlotLayout
from .log import logger
from .metadata import OffloadMetadata, WorkerReport
from .metrics import OffloadPromMetrics, OffloadStats
from .pool import adopt_physical_layout, build_store_config, unlink_anonymous_l1
from .scheduler import OffloadScheduler
from .stats import (
    ReportedStats,
    eviction_line,
    occupancy,
    recovery_line,
    store_counters,
)
from .worker import OffloadWorker


class MarconiOffloadConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """Two-tier (RAM + disk) CPU KV offload with Marconi eviction."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._config = OffloadConfig.from_extra_config(extra)
        version = compat.vllm_version()
        unsupported = compat.check_supported(version)
        if unsupported:
            logger.warning(unsupported)
        parallel = vllm_config.parallel_config
        if int(parallel.pipeline_parallel_size) > 1:
            raise ValueError(
                "MarconiOffloadConnector supports tensor and data parallelism only; "
                f"pipeline_parallel_size={parallel.pipeline_parallel_size}"
            )
        self._layout = SlotLayout.from_kv_cache_config(kv_cache_config)
        self._block_size = compat.scheduler_block_size(vllm_config, kv_cache_config)
        store_config = build_store_config(vllm_config, self._config, self._layout, self._block_size)
        self._scheduler: OffloadScheduler | None = None
        self._worker: OffloadWorker | None = None
        self._reported = ReportedStats()
        self._hit_lines_logged = 0
        self._store: TieredStore | None = None
        if role == KVConnectorRole.SCHEDULER:
            with user_keys():
                self._store = TieredStore(adopt_physical_layout(store_config), create_l1=False)
            if store_config.l2 is not None:
                logger.info(recovery_line(self._store.recovery, store_config.l2.path))
            if self._config.cpu_pool_path is None:
                unlink_anonymous_l1(store_config)
            self._scheduler = OffloadScheduler(
                self._store,
                self._layout,
                self._block_size,
                int(parallel.tensor_parallel_size),
                kv_cache_config,
                LoadCostModel(
                    l2_read_bytes_per_s=self._config.l2_read_bytes_per_s,
                    prefill_tokens_per_s=self._config.prefill_tokens_per_s,
                ),
            )
            self._warn_if_hashes_change(vllm_config, version)
            logger.info(
                "MarconiOffloadConnector ready: L1 %s (%d bytes), L2 %s, eviction=%s, "
                "admission_threshold=%d, block_size=%d, slot=%d bytes",
                store_config.l1.path,
                self._config.cpu_bytes_to_use,
                store_config.l2.path if store_config.l2 else "off",
                self._config.eviction_policy,
                self._config.admission_threshold,
                self._block_size,
                self._layout.stride,
            )
        else:
            self._worker = OffloadWorker(store_config, self._layout, compat.tensor_parallel_rank())

    def _warn_if_hashes_change(self, vllm_config: Any, version: str) -> None:
        if not self._config.has_l2:
            return
        problem = restart_hash_problem(
            version, compat.hash_algorithm(vllm_config), compat.pythonhashseed()
        )
        if problem:
            logger.warning(
                "L2 persistence will not hit after a restart: %s. Set PYTHONHASHSEED "
                "(e.g. 0) for every vLLM process that should reuse this L2.",
                problem,
            )

    # -- worker side -------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_loads(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.run_stores(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self._worker is not None
        return None, self._worker.take_finished_loads()

    def build_connector_worker_meta(self) -> WorkerReport | None:
        assert self._worker is not None
        return self._worker.take_report()

    def _meta(self) -> OffloadMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OffloadMetadata)
        return meta

    # -- scheduler side ----------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.lookup(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        self._scheduler.allocated(request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._scheduler is not None
        meta = self._scheduler.build_metadata(scheduler_output)
        self._maybe_log()
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        assert self._scheduler is not None
        report = getattr(connector_output, "kv_connector_worker_meta", None)
        self._scheduler.on_worker_output(connector_output.finished_recving, report)

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        self._scheduler.request_finished(request.request_id)
        return False, None

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_work()

    def reset_cache(self) -> bool:
        """`reset_prefix_cache(reset_connector=True)`: drop every block nothing is using."""
        if self._store is None:
            return True
        dropped = self._store.clear()
        logger.info("MarconiOffloadConnector: reset dropped %d blocks from L1 and L2", dropped)
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        return False

    # -- observability -----------------------------------------------------------------
    def _maybe_log(self) -> None:
        assert self._scheduler is not None
        assert self._store is not None
        counters = self._scheduler.counters
        interval = self._config.hit_log_interval
        if counters.requests // interval > self._hit_lines_logged:
            self._hit_lines_logged = counters.requests // interval
            logger.info(counters.hit_line())
            logger.info(eviction_line(self._store.stats()))

    def get_kv_connector_stats(self) -> OffloadStats | None:
        if self._scheduler is None or self._store is None:
            return None
        store_stats = self._store.stats()
        data: dict[str, Any] = self._reported.changes(
            counters={**self._scheduler.counters.as_dict(), **store_counters(store_stats)},
            gauges=occupancy(store_stats, self._store.config),
        )
        data.update(self._scheduler.timer.take())
        stats = OffloadStats(data=data)
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> OffloadStats:
        return OffloadStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> OffloadPromMetrics:
        return OffloadPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
