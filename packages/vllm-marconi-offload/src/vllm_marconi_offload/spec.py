"""`OffloadSpec`: everything the connector builds from vLLM's configuration, in one place.

In the manner of vLLM's `OffloadingSpec`: built from the config in every process, it
parses `kv_connector_extra_config`, checks the vLLM version and parallelism, derives the
slot layout, the scheduler's block size and the store configuration (files, engine name,
fingerprint), and then builds the role's object: `scheduler()` in the engine-core
process, `worker(rank)` in each worker. Importing it does not import vLLM (nor torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool_mmap import StoreConfig, TieredStore
from vllm_kv_identity import restart_hash_problem

from . import compat
from .config import OffloadConfig
from .cost import LoadCostModel
from .layout import SlotLayout
from .log import logger
from .pool import adopt_physical_layout, build_store_config, unlink_anonymous_l1
from .scheduler import OffloadScheduler
from .stats import recovery_line

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from .worker import OffloadWorker


@dataclass(frozen=True)
class OffloadSpec:
    """The connector's settings and derived geometry, identical in every process."""

    config: OffloadConfig
    layout: SlotLayout
    block_size: int
    """Tokens per block as the scheduler hashes them."""
    store_config: StoreConfig
    tensor_parallel_size: int
    kv_cache_config: KVCacheConfig
    vllm_version: str
    hash_algorithm: str

    @classmethod
    def from_vllm_config(
        cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
    ) -> OffloadSpec:
        """Validate the connector's settings against this engine and derive the rest.

        Raises `ConfigError` for a bad `kv_connector_extra_config` and `ValueError` for
        pipeline parallelism; warns (once per process) on an untested vLLM version.
        """
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None, "vLLM builds a KV connector only from a kv_transfer_config"
        config = OffloadConfig.from_extra_config(transfer.kv_connector_extra_config)
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
        layout = SlotLayout.from_kv_cache_config(kv_cache_config)
        block_size = compat.scheduler_block_size(vllm_config, kv_cache_config)
        return cls(
            config=config,
            layout=layout,
            block_size=block_size,
            store_config=build_store_config(vllm_config, config, layout, block_size),
            tensor_parallel_size=int(parallel.tensor_parallel_size),
            kv_cache_config=kv_cache_config,
            vllm_version=version,
            hash_algorithm=compat.hash_algorithm(vllm_config),
        )

    def cost_model(self) -> LoadCostModel:
        """The L2 load-or-recompute model, seeded with the configured rates."""
        return LoadCostModel(
            l2_read_bytes_per_s=self.config.l2_read_bytes_per_s,
            prefill_tokens_per_s=self.config.prefill_tokens_per_s,
        )

    def open_store(self) -> TieredStore:
        """Scheduler side: attach to the workers' L1 files (after they registered their
        KV caches) and open or recover L2."""
        store = TieredStore(adopt_physical_layout(self.store_config), create_l1=False)
        if self.store_config.l2 is not None:
            logger.info(recovery_line(store.recovery, self.store_config.l2.path))
        if self.config.cpu_pool_path is None:
            unlink_anonymous_l1(self.store_config)
        return store

    def scheduler(self) -> OffloadScheduler:
        """The scheduler side, over a freshly opened store."""
        scheduler = OffloadScheduler(
            self.open_store(),
            self.layout,
            self.block_size,
            self.tensor_parallel_size,
            self.kv_cache_config,
            self.cost_model(),
            same_step_loads=self.config.load_mode != "async",
        )
        self._warn_if_hashes_change()
        store_config = self.store_config
        logger.info(
            "MarconiOffloadConnector ready: L1 %s (%d bytes), L2 %s, eviction=%s, "
            "admission_threshold=%d, block_size=%d, slot=%d bytes",
            store_config.l1.path,
            self.config.cpu_bytes_to_use,
            store_config.l2.path if store_config.l2 else "off",
            self.config.eviction_policy,
            self.config.admission_threshold,
            self.block_size,
            self.layout.stride,
        )
        return scheduler

    def worker(self, rank: int, agree: Callable[[str], str]) -> OffloadWorker:
        """The worker side of tensor-parallel rank `rank` (imports torch); `agree` makes
        every rank use rank 0's `load_mode="auto"` choice."""
        from .worker import OffloadWorker

        return OffloadWorker(self.store_config, self.layout, rank, self.config, agree=agree)

    def _warn_if_hashes_change(self) -> None:
        if not self.config.has_l2:
            return
        problem = restart_hash_problem(
            self.vllm_version, self.hash_algorithm, compat.pythonhashseed()
        )
        if problem:
            logger.warning(
                "L2 persistence will not hit after a restart: %s. Set PYTHONHASHSEED "
                "(e.g. 0) for every vLLM process that should reuse this L2.",
                problem,
            )
