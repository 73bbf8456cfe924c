"""GPU <-> L1 throughput of the connector's worker (store and load paths) against the
pinned-copy ceiling measured in the same run.

The KV cache is an 8B-class Llama's (32 layers, 8 KV heads x 128, bf16, 16-token blocks)
in vLLM 0.26 FlashAttention's layout: per layer a logical (blocks, heads, 16, 256) tensor
stored as (blocks, 16, heads, 256). The worker gets `OffloadMetadata` exactly as from the
scheduler and copies into its real page-locked L1 file in /dev/shm.

Usage: python transfer_bench.py [--blocks 1024] [--reps 5]   (writes $OUT/transfer.json)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import repo_path

repo_path.worker_modules()

import torch  # noqa: E402
from kvpool_mmap import StoreConfig, TierConfig  # noqa: E402
from vllm_marconi_offload.layout import SlotLayout  # noqa: E402
from vllm_marconi_offload.metadata import BlockTransfer, OffloadMetadata, TransferJob  # noqa: E402
from vllm_marconi_offload.worker import COPY_ENV, OffloadWorker  # noqa: E402

LAYERS, HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16
PAGE = HEADS * BLOCK * 2 * HEAD_SIZE * 2  # bytes of one layer's block
L1_DIR = "/dev/shm/transfer-bench"


def kv_caches(num_blocks: int, device: str) -> dict[str, torch.Tensor]:
    caches = {}
    for i in range(LAYERS):
        physical = torch.randn(num_blocks, BLOCK, HEADS, 2 * HEAD_SIZE, device=device).to(
            torch.bfloat16
        )
        caches[f"model.layers.{i}.self_attn.attn"] = physical.permute(0, 2, 1, 3)
    return caches


def layout_for(names: list[str], num_blocks: int) -> SlotLayout:
    spec = SimpleNamespace(page_size_bytes=PAGE, block_size=BLOCK, head_size=HEAD_SIZE)
    group = SimpleNamespace(layer_names=names, kv_cache_spec=spec)
    return SlotLayout.from_kv_cache_config(
        SimpleNamespace(kv_cache_groups=[group], num_blocks=num_blocks)
    )


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], None], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def rate(nbytes: int, times: list[float]) -> dict[str, float]:
    return {
        "best_GBps": round(nbytes / min(times) / 1e9, 2),
        "median_GBps": round(nbytes / statistics.median(times) / 1e9, 2),
        "median_ms": round(statistics.median(times) * 1e3, 2),
    }


def ceilings(nbytes: int, reps: int, pool: torch.Tensor) -> dict[str, Any]:
    """Plain contiguous copies: torch-pinned host buffer and the registered L1 rows."""
    gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    rows = pool[: nbytes // pool.shape[1]].reshape(-1)
    out = {
        "pinned_d2h": rate(nbytes, timed(lambda: pinned.copy_(gpu, non_blocking=True), reps)),
        "pinned_h2d": rate(nbytes, timed(lambda: gpu.copy_(pinned, non_blocking=True), reps)),
        "l1_rows_d2h": rate(nbytes, timed(lambda: rows.copy_(gpu, non_blocking=True), reps)),
        "l1_rows_h2d": rate(nbytes, timed(lambda: gpu.copy_(rows, non_blocking=True), reps)),
    }
    return out


class Bench:
    """One worker on one KV cache; stores and loads `blocks` blocks per job."""

    def __init__(self, num_gpu_blocks: int, blocks: int, mode: str, device: str) -> None:
        os.environ[COPY_ENV] = mode
        self.caches = kv_caches(num_gpu_blocks, device)
        self.layout = layout_for(list(self.caches), num_gpu_blocks)
        config = StoreConfig(
            stride=self.layout.stride,
            engine_id=f"transfer-bench-{mode}",
            fingerprint=bytes(16),
            l1=TierConfig(path=L1_DIR, bytes_to_use=(2 * blocks + 64) * PAGE * LAYERS),
        )
        self.worker = OffloadWorker(config, self.layout, rank=0)
        self.worker.register_kv_caches(self.caches)
        self.pool = self.worker._pool
        assert self.pool is not None
        self.blocks = blocks
        self.num_gpu_blocks = num_gpu_blocks
        self.jobs = 0

    def job(self, gpu_blocks: list[int], slots: list[int]) -> TransferJob:
        self.jobs += 1
        transfer = BlockTransfer(0, tuple(gpu_blocks), tuple(slots))
        return TransferJob(self.jobs, f"req-{self.jobs}", (transfer,))

    def store(self, gpu_blocks: list[int], slots: list[int]) -> None:
        self.worker.run_stores(OffloadMetadata(stores=[self.job(gpu_blocks, slots)]))
        self.worker.drain()
        assert self.worker.take_report() is not None

    def load(self, slots: list[int], gpu_blocks: list[int]) -> None:
        self.worker.start_loads(OffloadMetadata(loads=[self.job(gpu_blocks, slots)]))
        self.worker.drain()
        assert self.worker.take_finished_loads()

    def run(self, reps: int) -> dict[str, Any]:
        rng = random.Random(0)
        nbytes = self.blocks * self.layout.stride
        src = rng.sample(range(self.num_gpu_blocks), self.blocks)
        dst = rng.sample(sorted(set(range(self.num_gpu_blocks)) - set(src)), self.blocks)
        contiguous = list(range(self.blocks))
        scattered = rng.sample(range(2 * self.blocks), self.blocks)
        result = {
            "store_contiguous_slots": rate(
                nbytes, timed(lambda: self.store(src, contiguous), reps)
            ),
            "load_contiguous_slots": rate(nbytes, timed(lambda: self.load(contiguous, dst), reps)),
            "store_scattered_slots": rate(nbytes, timed(lambda: self.store(src, scattered), reps)),
            "load_scattered_slots": rate(nbytes, timed(lambda: self.load(scattered, dst), reps)),
        }
        result["round_trip_exact"] = self.check(src, dst)
        return result

    def check(self, src: list[int], dst: list[int]) -> bool:
        """Blocks stored from `src` and loaded into `dst` must be byte-identical."""
        for tensor in self.caches.values():
            raw = tensor.permute(0, 2, 1, 3)
            if not torch.equal(raw[src], raw[dst]):
                return False
        return True

    def close(self) -> None:
        self.worker.shutdown()
        del self.caches
        shutil.rmtree(L1_DIR, ignore_errors=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=1024)
    parser.add_argument("--gpu-blocks", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cpu-smoke", action="store_true", help="check the script on CPU")
    args = parser.parse_args()
    batch = args.blocks * PAGE * LAYERS
    result: dict[str, Any] = {"blocks": args.blocks, "slot_bytes": PAGE * LAYERS}
    if args.cpu_smoke:
        generic = Bench(args.gpu_blocks, args.blocks, "generic", "cpu")
        result["worker_generic"] = generic.run(1)
        generic.close()
        print(json.dumps(result, indent=1))
        return
    result.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    bench = Bench(args.gpu_blocks, args.blocks, "async", "cuda")
    result["ceiling"] = ceilings(batch, args.reps, bench.pool)
    result["worker_async"] = bench.run(args.reps)
    bench.close()
    generic = Bench(args.gpu_blocks, args.blocks, "generic", "cuda")
    result["worker_generic"] = generic.run(2)
    generic.close()
    pinned = {
        "store": result["ceiling"]["pinned_d2h"]["median_GBps"],
        "load": result["ceiling"]["pinned_h2d"]["median_GBps"],
    }
    result["median_ratio_to_pinned"] = {
        f"{path}_{kind}_{slots}": round(
            result[path][f"{kind}_{slots}_slots"]["median_GBps"] / pinned[kind], 3
        )
        for path in ("worker_async", "worker_generic")
        for kind in ("store", "load")
        for slots in ("contiguous", "scattered")
    }
    print(json.dumps(result, indent=1), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "transfer.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
