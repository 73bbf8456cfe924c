"""Worker side of the connector: copies blocks between the KV cache and L1.

Runs in each vLLM worker process. Loads run in `start_load_kv` (the requests they serve
wait in WAITING_FOR_REMOTE_KVS, so the forward pass never reads them this step); stores
run in `wait_for_save`, after the forward, and complete before the step ends, so a GPU
block is never reused while its copy is still reading it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch
from kvpool_mmap import StoreConfig, open_l1_rank

from .block_copy import BlockCopier
from .layout import SlotLayout
from .log import logger
from .metadata import OffloadMetadata, StoreCompletions, TransferJob


class OffloadWorker:
    """Executes the scheduler's transfer jobs against this rank's L1 file."""

    def __init__(self, store_config: StoreConfig, layout: SlotLayout, rank: int) -> None:
        self._store_config = store_config
        self._layout = layout
        self._rank = rank
        self._copier: BlockCopier | None = None
        self._l1: object | None = None
        self._pool: torch.Tensor | None = None
        self._finished_loads: set[str] = set()
        self._finished_stores: Counter[int] = Counter()

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Map the KV cache tensors and create this rank's L1 file."""
        self._copier = BlockCopier(self._layout, kv_caches)
        l1 = open_l1_rank(self._store_config, rank=self._rank, create=True)
        first = next(iter(kv_caches.values()))
        if first.is_cuda:
            l1.register_cuda()
        self._l1 = l1
        self._pool = l1.torch_view()
        logger.info(
            "vllm-marconi-offload worker rank %d: L1 %s, %d slots of %d bytes",
            self._rank,
            l1.path,
            self._pool.shape[0],
            self._pool.shape[1],
        )

    def start_loads(self, meta: OffloadMetadata) -> None:
        for job in meta.loads:
            self._run(job, load=True)
            self._finished_loads.add(job.req_id)

    def run_stores(self, meta: OffloadMetadata) -> None:
        for job in meta.stores:
            self._run(job, load=False)
            self._finished_stores[job.job_id] += 1
        if meta.stores and self._pool is not None and self._pool.is_cuda:
            torch.cuda.current_stream().synchronize()

    def _run(self, job: TransferJob, *, load: bool) -> None:
        assert self._copier is not None, "register_kv_caches first"
        assert self._pool is not None, "register_kv_caches first"
        for transfer in job.transfers:
            if load:
                self._copier.from_slots(
                    transfer.group_id, transfer.slots, transfer.gpu_blocks, self._pool
                )
            else:
                self._copier.to_slots(
                    transfer.group_id, transfer.gpu_blocks, transfer.slots, self._pool
                )

    def take_finished_loads(self) -> set[str] | None:
        finished, self._finished_loads = self._finished_loads, set()
        return finished or None

    def take_store_completions(self) -> StoreCompletions | None:
        if not self._finished_stores:
            return None
        done, self._finished_stores = self._finished_stores, Counter()
        return StoreCompletions(done=done)

    def shutdown(self) -> None:
        close = getattr(self._l1, "close", None)
        if close is not None:
            close()
