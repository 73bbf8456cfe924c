"""GPU <-> page-locked rows throughput of the plugins' shared `BlockCopier` (no vLLM).

    python3 block_copy_bench.py [--blocks 1024] [--threads 1,4] [--reps 3]

An 8B Llama's KV cache as direct mode sees it (32 per-layer tensors of `[num_blocks, 64 KiB]`
int8, 2 MiB per block), random scattered block ids; each thread owns a copier and 64 host
rows (128 MiB) and moves its share of `--blocks` blocks in parts of 64 (gather = store
side, scatter = load side). Reports GB/s per direction and thread count against one
pinned 128 MiB copy (the ceiling), and checks that every byte round-trips.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import repo_path

repo_path.add_sources()

import torch  # noqa: E402
from gpu_timing import rate, sync, timed  # noqa: E402
from vllm_kv_identity.block_copy import BlockCopier, mark  # noqa: E402

LAYERS, PAGE, ROWS = 32, 64 << 10, 64
CUDA = torch.cuda.is_available()  # without CUDA: a functional check on CPU


def run(kind: str, tensors: list[torch.Tensor], blocks: list[int], threads: int) -> float:
    groups = [[(t, PAGE) for t in range(LAYERS)]]
    shares = [blocks[i::threads] for i in range(threads)]
    hosts = [torch.empty((ROWS, LAYERS * PAGE), dtype=torch.int8, pin_memory=CUDA)
             for _ in range(threads)]  # fmt: skip
    copiers = [BlockCopier(tensors, groups, h) for h in hosts]
    after = mark(tensors[0].device)

    def work(i: int) -> None:
        share = shares[i]
        for start in range(0, len(share), ROWS):
            part = share[start : start + ROWS]
            if kind == "gather":
                copiers[i].gather([(r, 0, b) for r, b in enumerate(part)], after)
            else:
                copiers[i].scatter([(r, 0, b) for r, b in enumerate(part)], after)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(blocks) * LAYERS * PAGE / (time.perf_counter() - started) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--gpu-blocks", type=int, default=4096)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda" if CUDA else "cpu")
    tensors = [torch.randint(-128, 127, (args.gpu_blocks, PAGE), dtype=torch.int8, device=dev)
               for _ in range(LAYERS)]  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(args.gpu_blocks, generator=gen).tolist()
    src, dst = perm[: args.blocks], perm[args.blocks : 2 * args.blocks]

    host = torch.empty((ROWS, LAYERS * PAGE), dtype=torch.int8, pin_memory=CUDA)
    flat = torch.empty_like(host, device=dev)
    ceiling = rate(host.numel(), timed(lambda: host.copy_(flat, non_blocking=True), args.reps))

    # correctness: gather src blocks, scatter them into dst blocks, compare
    check = BlockCopier(tensors, [[(t, PAGE) for t in range(LAYERS)]], host)
    check.gather([(r, 0, b) for r, b in enumerate(src[:ROWS])])
    check.scatter([(r, 0, b) for r, b in enumerate(dst[:ROWS])])
    sync()
    same = all(torch.equal(t[src[:ROWS]], t[dst[:ROWS]]) for t in tensors)

    result: dict[str, object] = {"blocks": args.blocks, "block_bytes": LAYERS * PAGE,
                                 "pinned_ceiling_GBps": ceiling["best_GBps"], "round_trip_ok": same}  # fmt: skip
    for threads in [int(n) for n in args.threads.split(",")]:
        for kind, ids in (("gather", src), ("scatter", dst)):
            rates = [run(kind, tensors, ids, threads) for _ in range(args.reps)]
            result[f"{kind}_t{threads}_GBps"] = sorted(rates)[len(rates) // 2]
            print(f"{kind} threads={threads}: {', '.join(f'{r:.1f}' for r in rates)} GB/s",
                  flush=True)  # fmt: skip
    print("RESULT " + json.dumps(result), flush=True)
    out = Path(os.environ.get("OUT") or "/tmp") / "block-copy.json"
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
