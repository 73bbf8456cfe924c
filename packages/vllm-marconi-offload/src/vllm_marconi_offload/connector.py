"""`MarconiOffloadConnector`: vLLM's KV connector interface, delegating to one side.

vLLM builds one instance with the SCHEDULER role in the engine-core process and one with
the WORKER role in each worker; each delegates to `OffloadScheduler` or `OffloadWorker`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from . import compat, kv_events
from .events import TierEvents
from .log import logger
from .metadata import OffloadMetadata, WorkerReport
from .metrics import OffloadPromMetrics, OffloadStats
from .request_params import ERROR_KEY
from .scheduler import OffloadScheduler
from .spec import OffloadSpec
from .stats import StatsReporter
from .worker import OffloadWorker

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class MarconiOffloadConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """Two-tier (RAM + disk) CPU KV offload with Marconi eviction."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        spec = OffloadSpec.from_vllm_config(vllm_config, kv_cache_config)
        self._scheduler: OffloadScheduler | None = None
        self._worker: OffloadWorker | None = None
        self._reporter: StatsReporter | None = None
        self._events: kv_events.EventBuilder | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = spec.scheduler()
            if compat.events_enabled(vllm_config):
                self._events = kv_events.EventBuilder(spec.block_size, kv_cache_config)
                describe = partial(kv_events.describe_block, block_size=spec.block_size)
                self._scheduler.publish_events(TierEvents(describe))
            self._reporter = StatsReporter(
                self._scheduler.counters,
                self._scheduler.timer,
                self._scheduler.store_stats,
                spec.store_config,
                spec.config.hit_log_interval,
            )
        else:
            self._worker = spec.worker(compat.tensor_parallel_rank(), compat.rank_zero_choice)

    # -- worker side -------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_loads(
            self._meta(), layer_waits=compat.attention_waits_per_layer(forward_context)
        )

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self._worker is not None
        self._worker.wait_for_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
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
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.lookup(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.allocated(request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        meta = OffloadMetadata.of(self._scheduler.build_metadata(scheduler_output))
        assert self._reporter is not None
        for line in self._reporter.due_log_lines():
            logger.info(line)
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        assert self._scheduler is not None
        report = compat.worker_meta(connector_output)
        self._scheduler.on_worker_output(connector_output.finished_recving, report)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        error = self._scheduler.request_finished(request.request_id)
        return False, ({ERROR_KEY: error} if error is not None else None)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_work()

    def reset_cache(self) -> bool:
        """`reset_prefix_cache(reset_connector=True)`: drop every block nothing is using."""
        if self._scheduler is None:
            return True
        dropped = self._scheduler.reset()
        logger.info("MarconiOffloadConnector: reset dropped %d blocks from L1 and L2", dropped)
        return True

    @property
    def requires_kv_delivery(self) -> bool:
        return False

    # -- observability -----------------------------------------------------------------
    def take_events(self) -> Iterable[KVCacheEvent]:
        """What L1 (medium CPU) and L2 (STORAGE) started or stopped holding since the last
        step, as vLLM's KV events (only with `--kv-events-config`)."""
        if self._events is None or self._scheduler is None:
            return ()
        return self._events.build(self._scheduler.take_changes())

    def get_kv_connector_stats(self) -> OffloadStats | None:
        if self._reporter is None:
            return None
        stats = OffloadStats(data=self._reporter.report())
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> OffloadStats:
        return OffloadStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
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
