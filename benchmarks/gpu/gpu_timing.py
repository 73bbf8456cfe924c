"""Timing GPU work from the host: `sync`, repeated `timed` runs and their `rate` in GB/s."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync() -> None:
    """Wait for all queued GPU work (nothing without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], None], reps: int) -> list[float]:
    """Seconds of each of `reps` calls of `fn`, the GPU drained before and after each."""
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def rate(nbytes: int, times: list[float]) -> dict[str, float]:
    """Best and median GB/s (and the median ms) of moving `nbytes` in each of `times`."""
    return {
        "best_GBps": round(nbytes / min(times) / 1e9, 2),
        "median_GBps": round(nbytes / statistics.median(times) / 1e9, 2),
        "median_ms": round(statistics.median(times) * 1e3, 2),
    }
