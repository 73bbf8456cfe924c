"""GPU <-> L1 throughput of the connector's worker (store and load paths) against the
pinned-copy ceiling measured in the same run, for each async copy mode, with the host time
spent issuing a job (what the engine's main thread pays before the forward runs).

The KV cache is an 8B-class Llama's (32 layers, 8 KV heads x 128, bf16, 16-token blocks)
in vLLM 0.26 FlashAttention's layout: per layer a logical (blocks, heads, 16, 256) tensor
stored as (blocks, 16, heads, 256). The worker gets `OffloadMetadata` exactly as from the
scheduler and copies into its real page-locked L1 file in /dev/shm.

Usage: python transfer_bench.py [--blocks 1024] [--reps 5] [--modes async,direct,...]
(writes $OUT/transfer.json). Modes: the copy paths (`copy_path`), `layer-wise` (loads as
`load_mode=layer_wise` issues them) and `auto` (the worker times both load paths at start
as `load_mode=auto` does, logs its `load_mode auto:` line, and loads by the one it keeps;
the JSON's `load_mode` says which). `--wave N` adds a step that loads N jobs of 375 blocks (a
6,000-token session each, as in the multi-turn benchmark) at once. Each mode also reports
`store_during_load`: how long the caller's stream waits for a 16-block store issued while
a load of `--blocks` blocks crosses the link; `--beside` adds `compute_beside_load`: a
step's matmuls and, apart, its input copy, alone and beside a load, for five ways of
crossing PCIe.
Tensor parallelism: `GPU_BENCH_TP=2 GPU_BENCH_RANK=R CUDA_VISIBLE_DEVICES=R` is one rank
(4 KV heads, 1 MiB a block, its own L1 file); start one process a GPU at once to measure
every rank's throughput and its own pinned ceiling while the other rank copies too
(writes $OUT/transfer-rR-tp2.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import model_8b
import repo_path

repo_path.worker_modules()

import torch  # noqa: E402
from gpu_timing import rate, sync, timed  # noqa: E402
from kvpool_mmap import StoreConfig, TierConfig  # noqa: E402
from vllm_marconi_offload import cuda_mover  # noqa: E402
from vllm_marconi_offload.config import OffloadConfig  # noqa: E402
from vllm_marconi_offload.layout import SlotLayout  # noqa: E402
from vllm_marconi_offload.metadata import BlockTransfer, OffloadMetadata, TransferJob  # noqa: E402
from vllm_marconi_offload.worker import OffloadWorker  # noqa: E402

RANK = int(os.environ.get("GPU_BENCH_RANK", "0"))  # under GPU_BENCH_TP=N: this process's rank
LAYERS, HEADS, HEAD_SIZE, BLOCK = 32, 8 // model_8b.TP, 128, 16
PAGE = HEADS * BLOCK * 2 * HEAD_SIZE * 2  # bytes of one layer's block (one rank's heads)
L1_DIR = f"/dev/shm/transfer-bench-r{RANK}"


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
        # `layer-wise`: the async path's stores, loads as `load_mode=layer_wise` issues them
        # (same-step, one kernel per layer), each layer waited for as the forward would;
        # `auto`: as `layer-wise` or as same-step `async`, whichever the worker keeps.
        load_mode = {"layer-wise": "layer_wise", "auto": "auto"}.get(mode, "async")
        copy_path = "async" if load_mode != "async" else mode
        settings = OffloadConfig.from_extra_config({"load_mode": load_mode, "copy_path": copy_path})
        self.caches = kv_caches(num_gpu_blocks, device)
        self.layout = layout_for(list(self.caches), num_gpu_blocks)
        config = StoreConfig(
            stride=self.layout.stride,
            engine_id=f"transfer-bench-{mode}",
            fingerprint=bytes(16),
            l1=TierConfig(
                path=L1_DIR, bytes_to_use=(2 * blocks + 64) * PAGE * LAYERS * model_8b.TP
            ),
            tp_size=model_8b.TP,
        )
        self.worker = OffloadWorker(config, self.layout, RANK, settings)
        self.worker.register_kv_caches(self.caches)
        self.load_mode = self.worker.load_mode
        self.layer_wise = self.load_mode == "layer_wise"
        self.same_step = self.load_mode != "async"
        self.forward()  # what teaches the worker the forward's layer order
        self._mover = self.worker._mover  # compute_beside_load varies it
        self.pool = self.worker._pool
        assert self.pool is not None
        self.blocks = blocks
        self.num_gpu_blocks = num_gpu_blocks
        self.jobs = 0
        self.issue_s: list[float] = []

    def forward(self) -> None:
        """Each attention layer's hook, in order, as a forward run eagerly calls them."""
        for name in self.caches:
            self.worker.wait_for_layer(name)

    def job(self, gpu_blocks: list[int], slots: list[int], *, load: bool = False) -> TransferJob:
        self.jobs += 1
        transfer = BlockTransfer(0, tuple(gpu_blocks), tuple(slots))
        same_step = load and self.same_step
        return TransferJob(self.jobs, f"req-{self.jobs}", (transfer,), same_step=same_step)

    def store(self, gpu_blocks: list[int], slots: list[int]) -> None:
        meta = OffloadMetadata(stores=[self.job(gpu_blocks, slots)])
        start = time.perf_counter()
        self.worker.run_stores(meta)
        self.issue_s.append(time.perf_counter() - start)
        self.worker.drain()
        assert self.worker.take_report() is not None

    def load(self, slots: list[int], gpu_blocks: list[int], jobs: int = 1) -> None:
        per_job = len(slots) // jobs
        meta = OffloadMetadata(
            loads=[
                self.job(gpu_blocks[i : i + per_job], slots[i : i + per_job], load=True)
                for i in range(0, per_job * jobs, per_job)
            ]
        )
        start = time.perf_counter()
        self.worker.start_loads(meta, layer_waits=self.layer_wise)
        self.issue_s.append(time.perf_counter() - start)
        if self.layer_wise:
            self.forward()
        self.worker.drain()
        done = self.worker.take_report() if self.same_step else self.worker.take_finished_loads()
        assert done

    def issued(self, fn: Callable[[], None], reps: int, nbytes: int) -> dict[str, float]:
        """`rate` of `fn`, plus the median host time spent issuing it."""
        self.issue_s = []
        result = rate(nbytes, timed(fn, reps))
        result["issue_ms"] = round(statistics.median(self.issue_s) * 1e3, 2)
        return result

    def run(self, reps: int) -> dict[str, Any]:
        rng = random.Random(0)
        nbytes = self.blocks * self.layout.stride
        src = rng.sample(range(self.num_gpu_blocks), self.blocks)
        dst = rng.sample(sorted(set(range(self.num_gpu_blocks)) - set(src)), self.blocks)
        contiguous = list(range(self.blocks))
        scattered = rng.sample(range(2 * self.blocks), self.blocks)
        result: dict[str, Any] = {
            "store_contiguous_slots": self.issued(
                lambda: self.store(src, contiguous), reps, nbytes
            ),
            "load_contiguous_slots": self.issued(lambda: self.load(contiguous, dst), reps, nbytes),
            "store_scattered_slots": self.issued(lambda: self.store(src, scattered), reps, nbytes),
            "load_scattered_slots": self.issued(lambda: self.load(scattered, dst), reps, nbytes),
        }
        result["round_trip_exact"] = self.check(src, dst)
        return result

    def wave(self, jobs: int, reps: int) -> dict[str, Any]:
        """`jobs` loads of 375 scattered blocks in one step (a multi-turn wave)."""
        rng = random.Random(1)
        count = min(jobs * 375, self.blocks)
        slots = rng.sample(range(2 * self.blocks), count)
        gpu_blocks = rng.sample(range(self.num_gpu_blocks), count)
        nbytes = count * self.layout.stride
        return self.issued(lambda: self.load(slots, gpu_blocks, jobs), reps, nbytes)

    def beside_load(self, job: TransferJob | None, work: Callable[[], None]) -> tuple[float, float]:
        """Issue `job`'s load (none: no load), then `work` on the caller's stream: seconds
        until the caller's stream has done `work`, and until every transfer has landed."""
        sync()
        start = time.perf_counter()
        if job is not None:
            self.worker.start_loads(OffloadMetadata(loads=[job]))
        work()
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        caller_s = time.perf_counter() - start
        self.worker.drain()
        if job is not None:
            assert self.worker.take_finished_loads()
        return caller_s, time.perf_counter() - start

    def store_during_load(self, reps: int, store_blocks: int = 16) -> dict[str, float]:
        """A load of `blocks` blocks, then at once a store of `store_blocks` other blocks
        (a request that computes while its wave still loads): how long the caller's stream
        waits for the store (what the next forward waits for), against the whole load."""
        load_blocks = list(range(self.blocks))
        load_slots = list(range(self.blocks))
        src = list(range(self.blocks, self.blocks + store_blocks))
        slots = list(range(2 * self.blocks, 2 * self.blocks + store_blocks))

        def store() -> None:
            self.worker.run_stores(OffloadMetadata(stores=[self.job(src, slots)]))

        runs = []
        for _ in range(reps):
            runs.append(self.beside_load(self.job(load_blocks, load_slots), store))
            assert self.worker.take_report() is not None
        return {
            "caller_wait_ms": round(statistics.median(c for c, _ in runs) * 1e3, 2),
            "load_ms": round(statistics.median(t for _, t in runs) * 1e3, 2),
        }

    def compute_beside_load(self, reps: int) -> dict[str, Any]:
        """A step's GPU work on the caller's stream, alone and issued right after a load of
        `blocks` scattered blocks (a multi-turn wave), in two parts: a chain of
        forward-sized matmuls, and a small pinned H2D copy as vLLM makes of a step's
        inputs. A part that takes as long as the load beside it was kept from running by
        the load: the matmuls by copy programs holding the SMs, the copy by the wave's DMA
        ahead of it. One row per way of crossing PCIe: the copy kernel with one program per
        8 KiB item, one per SM, 32 and 16 in all, and DMA only."""
        assert self._mover is not None
        weights = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        acts = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
        inputs = torch.zeros(1 << 14, dtype=torch.int64).pin_memory()
        staged = torch.empty_like(inputs, device="cuda")

        def matmuls() -> None:
            for _ in range(16):
                torch.matmul(acts, weights)

        def input_copy() -> None:
            staged.copy_(inputs, non_blocking=True)

        rng = random.Random(3)
        slots = rng.sample(range(2 * self.blocks), self.blocks)
        gpu_blocks = list(range(self.blocks))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        ways = {"kernel_per_item": (None, True), "kernel_per_sm": (sms, True)}
        ways |= {"kernel_32": (32, True), "kernel_16": (16, True), "dma_only": (sms, False)}
        result: dict[str, Any] = {}
        kernel_runs = cuda_mover.MAX_DMA_RUNS
        for name, (programs, kernel) in ways.items():
            self._mover._host_programs = programs  # the benchmark's own knob
            cuda_mover.MAX_DMA_RUNS = kernel_runs if kernel else len(slots)
            self.beside_load(self.job(gpu_blocks, slots), matmuls)  # compile, warm up
            row: dict[str, float] = {}
            for part, work in (("matmuls", matmuls), ("input_copy", input_copy)):
                alone = [self.beside_load(None, work)[0] for _ in range(reps)]
                beside = [self.beside_load(self.job(gpu_blocks, slots), work) for _ in range(reps)]
                row[f"{part}_alone_ms"] = round(statistics.median(alone) * 1e3, 2)
                row[f"{part}_beside_load_ms"] = round(
                    statistics.median(w for w, _ in beside) * 1e3, 2
                )
                row[f"load_beside_{part}_ms"] = round(
                    statistics.median(t for _, t in beside) * 1e3, 2
                )
            result[name] = row
        cuda_mover.MAX_DMA_RUNS = kernel_runs
        self._mover._host_programs = sms
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
    parser.add_argument(
        "--modes",
        default="async-per-layer,async,direct",
        help="copy paths, layer-wise or auto",
    )
    parser.add_argument("--wave", type=int, default=0, help="jobs per step in the wave test")
    parser.add_argument("--cpu-smoke", action="store_true", help="check the script on CPU")
    parser.add_argument(
        "--beside", action="store_true", help="async mode: compute_beside_load, five ways"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the worker's lines
    batch = args.blocks * PAGE * LAYERS
    result: dict[str, Any] = {
        "blocks": args.blocks,
        "slot_bytes": PAGE * LAYERS,
        "tp": model_8b.TP,
        "rank": RANK,
    }
    if args.cpu_smoke:
        generic = Bench(args.gpu_blocks, args.blocks, "generic", "cpu")
        result["worker_generic"] = generic.run(1)
        generic.close()
        auto = Bench(args.gpu_blocks, args.blocks, "auto", "cpu")
        result["worker_auto"] = {**auto.run(1), "load_mode": auto.load_mode}
        auto.close()
        print(json.dumps(result, indent=1))
        return
    result.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    modes = args.modes.split(",")
    for mode in modes:
        try:
            bench = Bench(args.gpu_blocks, args.blocks, mode, "cuda")
        except Exception as error:  # a mode this host cannot run is reported, not fatal
            result[f"worker_{mode}"] = {"error": repr(error)}
            continue
        if "ceiling" not in result:
            result["ceiling"] = ceilings(batch, args.reps, bench.pool)
        result[f"worker_{mode}"] = {**bench.run(args.reps), "load_mode": bench.load_mode}
        if args.wave:
            result[f"worker_{mode}"]["wave"] = bench.wave(args.wave, args.reps)
        result[f"worker_{mode}"]["store_during_load"] = bench.store_during_load(args.reps)
        if args.beside and mode == "async":
            result[f"worker_{mode}"]["compute_beside_load"] = bench.compute_beside_load(args.reps)
        bench.close()
        print(mode, json.dumps(result[f"worker_{mode}"]), flush=True)
    pinned = {
        "store": result["ceiling"]["pinned_d2h"]["median_GBps"],
        "load": result["ceiling"]["pinned_h2d"]["median_GBps"],
    }
    result["median_ratio_to_pinned"] = {
        f"{mode}_{kind}_{slots}": round(
            result[f"worker_{mode}"][f"{kind}_{slots}_slots"]["median_GBps"] / pinned[kind], 3
        )
        for mode in modes
        if "error" not in result[f"worker_{mode}"]
        for kind in ("store", "load")
        for slots in ("contiguous", "scattered")
    }
    print(json.dumps(result, indent=1), flush=True)
    out = os.environ.get("OUT")
    if out:
        name = model_8b.result_name(f"transfer-r{RANK}" if model_8b.TP > 1 else "transfer")
        with open(os.path.join(out, name), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
