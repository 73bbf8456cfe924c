"""`MemKVOffloadingSpec`: MemKV as vLLM's direct offload medium (no CPU pool in front).

`"spec_name": "MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec"`. The
scheduler side is `.direct_manager.MemKVDirectManager`, the worker side
`.direct_worker.MemKVDirectWorker`; settings are the `memkv_*` keys of
`kv_connector_extra_config` (`.config.DirectConfig`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _compat as c
from .config import ConfigError, DirectConfig
from .direct_manager import MemKVDirectManager
from .load_store_spec import MemKVLoadStoreSpec
from .metrics import metric_definitions
from .store import StoreConfig

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingMetricMetadata
    from vllm.v1.kv_offload.config import OffloadingConfig

    from .direct_worker import MemKVDirectWorker

__all__ = ["MemKVLoadStoreSpec", "MemKVOffloadingSpec"]


class MemKVOffloadingSpec(c.OffloadingSpec):  # type: ignore[misc]
    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.cfg = DirectConfig.from_extra_config(self.extra_config)
        parallel = config.parallel
        if parallel.pp_size != 1:
            raise RuntimeError(
                "memkv-vllm: MemKVOffloadingSpec supports tensor parallelism only; "
                f"pipeline_parallel_size={parallel.pp_size} is not supported (use 1)"
            )
        if c.prefill_context_parallel_size(parallel) != 1:
            raise RuntimeError(
                "memkv-vllm: MemKVOffloadingSpec supports tensor parallelism only; "
                f"prefill_context_parallel_size={parallel.pcp_size} is not supported (use 1)"
            )
        if self.blocks_per_chunk != 1:
            raise ConfigError(
                "kv_connector_extra_config", "block_size",
                f"MemKVOffloadingSpec offloads GPU blocks as they are, but block_size / "
                f"blocks_per_chunk makes chunks of {self.blocks_per_chunk} GPU blocks; "
                "remove block_size and blocks_per_chunk",
            )  # fmt: skip
        self._manager: MemKVDirectManager | None = None
        self._worker: MemKVDirectWorker | None = None

    def _store_config(self) -> StoreConfig:
        return StoreConfig.resolve(self.extra_config, "kv_connector_extra_config", "memkv_")

    def get_manager(self) -> MemKVDirectManager:
        if self._manager is None:
            parallel = self.config.parallel
            self._manager = MemKVDirectManager(
                self.cfg,
                self._store_config(),
                self.config.engine_id,
                parallel.world_size,
                events=c.events_enabled(self),
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> MemKVDirectWorker:
        if self._worker is None:
            from .direct_worker import MemKVDirectWorker

            self._worker = MemKVDirectWorker(
                self.cfg, self._store_config(), self.config, list(self.tokens_per_block),
                kv_caches,
            )  # fmt: skip
        return self._worker
