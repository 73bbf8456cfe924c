"""Times both same-step load paths of a CUDA worker on this host, once, at start.

The wave is this model's own layout: up to `WAVE_BYTES` of whole blocks, every KV-cache
group, from the worker's real page-locked L1 into its real KV cache, before vLLM has
scheduled anything. The wave is first stored from the same blocks into the same L1 slots,
so every load writes back the bytes the blocks already hold (nothing vLLM sees changes),
and slots are scratch until the scheduler, built after the workers, indexes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch

from .cuda_mover import CudaBlockMover
from .load_choice import LoadRates

WAVE_BYTES = 1 << 30
"""Bytes per timed load: an 8k-token hit of an 8B model, eight chunks of the staged path."""
ROUNDS = 3
BUDGET_S = 0.5
"""Timed rounds stop once this much has been spent (after at least one round)."""


def time_load_paths(
    mover: CudaBlockMover,
    pool: torch.Tensor,
    widths: Mapping[int, int],
    layer_counts: Mapping[int, int],
    num_gpu_blocks: int,
    same_step_label: str,
) -> LoadRates:
    """Best rate (bytes/s) of `mover.load` (`same_step`) and of `mover.load_layers`
    (`layer_wise`; None if a group cannot move by layer) over up to `ROUNDS` alternating
    rounds. `widths`: each group's bytes per block; `layer_counts`: its layers."""
    started = time.perf_counter()
    per_block = sum(widths.values())
    count = max(1, min(num_gpu_blocks, pool.shape[0], WAVE_BYTES // max(1, per_block)))
    ids = list(range(count))
    groups = sorted(group_id for group_id, width in widths.items() if width)
    for group_id in groups:
        mover.store(group_id, ids, ids, pool)

    def same_step() -> None:
        for group_id in groups:
            mover.load(group_id, ids, ids, pool)

    def layer_wise() -> None:
        for group_id in groups:
            order = list(range(layer_counts[group_id]))
            mover.load_layers(group_id, ids, ids, pool, order)

    paths: dict[str, Callable[[], None]] = {"same_step": same_step}
    if all(mover.loads_by_layer(group_id) for group_id in groups):
        paths["layer_wise"] = layer_wise
    for path in paths.values():  # warm: first launches, TLBs
        _seconds(path, mover)
    best = {name: float("inf") for name in paths}
    for _ in range(ROUNDS):
        for name, path in paths.items():
            best[name] = min(best[name], _seconds(path, mover))
        if time.perf_counter() - started > BUDGET_S:
            break
    wave = count * per_block
    return LoadRates(
        layer_wise=wave / best["layer_wise"] if "layer_wise" in best else None,
        same_step=wave / best["same_step"],
        wave_bytes=wave,
        seconds=time.perf_counter() - started,
        note="" if "layer_wise" in paths else "a KV-cache group cannot load layer by layer",
        same_step_label=same_step_label,
    )


def _seconds(path: Callable[[], None], mover: CudaBlockMover) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    path()
    mover.synchronize()
    torch.cuda.synchronize()
    return time.perf_counter() - start
