"""Seconds to make GIB GiB of host memory page-locked, the connector's start-up cost (issue 34).

`cudaHostAlloc` (torch's pinned allocation, the way vLLM's OffloadingConnector pins its
CPU tier); our L1 file in /dev/shm faulted in from one thread (posix_fallocate, then
MAP_POPULATE) or on several threads (`kvpool_mmap._prefault`), each then registered with
`cudaHostRegister`. Alternating, REPEATS times each; needs no vLLM.
Usage: python pin_bench.py [GIB] [REPEATS]   (writes $OUT/pin.json)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from typing import Any

import repo_path

repo_path.add_sources()

import torch  # noqa: E402
from kvpool_mmap import StoreConfig, TierConfig, _prefault, open_l1_rank  # noqa: E402

L1_DIR = "/dev/shm/pin-bench"
STRIDE = 2 << 20  # one 8B-model block


def cuda_host_alloc(nbytes: int) -> dict[str, float]:
    start = time.perf_counter()
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    total = time.perf_counter() - start
    del pinned
    # else the next repeat reuses these pages from torch's pinned-memory cache (0.0 s)
    empty_cache = getattr(torch._C, "_host_emptyCache", None)
    if empty_cache is not None:
        empty_cache()
    return {"total_s": total, "cache_emptied": float(empty_cache is not None)}


def l1_file(nbytes: int, *, parallel: bool) -> dict[str, float]:
    shutil.rmtree(L1_DIR, ignore_errors=True)
    config = StoreConfig(
        stride=STRIDE,
        engine_id="pin-bench",
        fingerprint=b"pin-bench",
        l1=TierConfig(L1_DIR, nbytes),
        l2=None,
    )
    supported = _prefault.supported
    if not parallel:
        _prefault.supported = lambda: False  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        l1 = open_l1_rank(config, 0, create=True)
        faulted = time.perf_counter()
        registered = l1.register_cuda()
        done = time.perf_counter()
    finally:
        _prefault.supported = supported  # type: ignore[method-assign]
    l1.close()
    shutil.rmtree(L1_DIR, ignore_errors=True)
    return {
        "fault_s": faulted - start,
        "register_s": done - faulted,
        "total_s": done - start,
        "registered": float(registered),
    }


def main() -> None:
    gib = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    nbytes = gib << 30
    torch.cuda.init()
    ways = {
        "cudaHostAlloc": lambda: cuda_host_alloc(nbytes),
        "l1_one_thread": lambda: l1_file(nbytes, parallel=False),
        "l1_threads": lambda: l1_file(nbytes, parallel=True),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            runs[name].append({k: round(v, 3) for k, v in way().items()})
            print(name, runs[name][-1], flush=True)
    result: dict[str, Any] = {"gib": gib, "threads": _prefault.default_threads(), "runs": runs}
    result["median_total_s"] = {
        name: statistics.median(r["total_s"] for r in rows) for name, rows in runs.items()
    }
    print("RESULT " + json.dumps(result), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "pin.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
