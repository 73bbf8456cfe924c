"""Benchmark: index operations per second, tier bandwidth against raw baselines, index memory.

    python -m kvpool_mmap.bench [--size-mb 1024] [--stride-kb 1024] [--l1-dir /dev/shm]
                                [--l2-dir /var/tmp] [--ops 20000] [--index-blocks 200000]

Everything runs in one process, in one run, on the same filesystems:
  * memcpy: numpy copy between two anonymous buffers (the ceiling for L1);
  * dd: `dd oflag=direct` / `iflag=direct` of the same volume in the L2 directory (the
    ceiling for L2);
  * L1 put/get: blocks copied into / out of the mmap'd tmpfs slots through the store;
  * L2 write: write-through of committed blocks (checksum + O_DIRECT write + header);
  * L2 read: promotions after a restart (read + checksum verification);
  * ops/s of lookup, begin_store+commit, begin_load+end_load (index only, 4 KiB slots);
  * bytes of Python heap per indexed block (tracemalloc), L1-only and L1+L2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from ._config import HEADER_BYTES, StoreConfig, TierConfig
from ._store import TieredStore

GB = 1e9


def _key(i: int) -> bytes:
    return i.to_bytes(32, "little") + b"\x00\x00"


def _config(l1: Path, l2: Path | None, stride: int, l1_slots: int, l2_slots: int) -> StoreConfig:
    return StoreConfig(
        stride=stride,
        engine_id="bench",
        fingerprint=b"bench",
        l1=TierConfig(l1, l1_slots * stride),
        l2=TierConfig(l2, l2_slots * (-(-stride // 4096) * 4096 + HEADER_BYTES)) if l2 else None,
        io_threads=4,
        max_inflight_io=64,
    )


def bench_memcpy(nbytes: int) -> float:
    """GB/s of a numpy copy between two anonymous buffers (best of 3)."""
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.empty_like(a)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        best = max(best, nbytes / (time.perf_counter() - t) / GB)
    return best


def bench_dd(directory: Path, nbytes: int) -> tuple[float, float]:
    """GB/s of O_DIRECT dd write then read of `nbytes` in `directory` (MB blocks)."""
    path = directory / "dd.bench"
    count = max(1, nbytes >> 20)

    def run(args: list[str]) -> float:
        t = time.perf_counter()
        out = subprocess.run(["dd", *args], capture_output=True, text=True, check=True).stderr
        wall = time.perf_counter() - t
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
        return int(m.group(1)) / float(m.group(2)) / GB if m else count * (1 << 20) / wall / GB

    try:
        w = run(
            ["if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "oflag=direct", "conv=fsync"]
        )
        r = run([f"if={path}", "of=/dev/null", "bs=1M", f"count={count}", "iflag=direct"])
    finally:
        path.unlink(missing_ok=True)
    return w, r


def bench_tiers(l1_dir: Path, l2_dir: Path, nbytes: int, stride: int) -> dict[str, float]:
    """GB/s of L1 put/get (copies through the store) and L2 write/read (flush, promotion)."""
    n = max(2, nbytes // stride)
    batch = 16
    src = np.random.default_rng(0).integers(0, 256, (batch, stride), dtype=np.uint8)
    dst = np.empty((batch, stride), dtype=np.uint8)
    dst.fill(1)
    out: dict[str, float] = {}
    cfg = dataclasses.replace(_config(l1_dir, l2_dir, stride, n, n), write_through=False)
    batches = [[_key(i) for i in range(s, min(n, s + batch))] for s in range(0, n, batch)]
    store = TieredStore(cfg)
    try:
        l1 = store.l1_files[0].array
        t = time.perf_counter()
        for keys in batches:
            ticket = store.begin_store(keys)
            for j, slot in enumerate(ticket.l1_slots):
                assert slot is not None
                np.copyto(l1[slot], src[j])
            store.commit_store(ticket)
        out["l1_put_GBps"] = n * stride / (time.perf_counter() - t) / GB
        t = time.perf_counter()
        for keys in batches:
            load = store.begin_load(keys)
            for j, slot in enumerate(load.l1_slots):
                np.copyto(dst[j], l1[slot])
            store.end_load(load)
        out["l1_get_GBps"] = n * stride / (time.perf_counter() - t) / GB
        t = time.perf_counter()
        store.flush()  # every block: checksum, O_DIRECT payload write, header; then fdatasync
        out["l2_write_GBps"] = n * stride / (time.perf_counter() - t) / GB
    finally:
        store.close(flush=False)
    # L2 read: reopen (fresh L1, recovered L2), promote everything, verifying checksums
    _drop_caches(l2_dir)
    store = TieredStore(cfg)
    try:
        assert len(store.recovery.blocks) == n, (len(store.recovery.blocks), n)
        t = time.perf_counter()
        loads = [store.begin_load(keys) for keys in batches]
        for lt in loads:
            store.wait_load(lt, timeout=120)
            assert not lt.failed
        out["l2_read_GBps"] = n * stride / (time.perf_counter() - t) / GB
        for lt in loads:
            store.end_load(lt)
    finally:
        store.close(flush=False)
    return out


def _drop_caches(directory: Path) -> None:
    """Drop the page cache of the L2 files (only matters without O_DIRECT)."""
    for f in directory.glob("*.l2"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_ops(l1_dir: Path, ops: int) -> dict[str, float]:
    """Index operations per second on 4 KiB slots (no data copies)."""
    chain = 16
    cfg = _config(l1_dir, None, 4096, ops, 0)
    out: dict[str, float] = {}
    with TieredStore(cfg) as store:
        keys = [_key(i) for i in range(ops)]
        t = time.perf_counter()
        for s in range(0, ops, chain):
            store.commit_store(store.begin_store(keys[s : s + chain]))
        out["put_blocks_per_s"] = ops / (time.perf_counter() - t)
        t = time.perf_counter()
        for s in range(0, ops, chain):
            store.lookup(keys[s : s + chain])
        out["lookup_blocks_per_s"] = ops / (time.perf_counter() - t)
        t = time.perf_counter()
        for s in range(0, ops, chain):
            ticket = store.begin_load(keys[s : s + chain])
            store.poll_load(ticket)
            store.end_load(ticket)
        out["get_blocks_per_s"] = ops / (time.perf_counter() - t)
        # steady state with eviction: every put evicts
        more = [_key(ops + i) for i in range(ops)]
        t = time.perf_counter()
        for s in range(0, ops, chain):
            store.commit_store(store.begin_store(more[s : s + chain]))
        out["put_evicting_blocks_per_s"] = ops / (time.perf_counter() - t)
    return out


def bench_index_memory(l1_dir: Path, l2_dir: Path, blocks: int) -> dict[str, float]:
    """Python heap bytes per indexed block (keys, entries, dicts, eviction policies)."""
    out: dict[str, float] = {}
    stride = 64  # tiny slots: the index, not the data, is measured
    for label, l2 in (("l1_only", None), ("l1_and_l2", l2_dir)):
        cfg = _config(l1_dir, l2, stride, blocks, blocks)
        store = TieredStore(cfg)
        try:
            keys = [_key(i) for i in range(blocks)]
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            for s in range(0, blocks, 64):
                store.commit_store(store.begin_store(keys[s : s + 64]))
            store.flush()
            used = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            out[f"index_bytes_per_block_{label}"] = used / blocks
        finally:
            store.close(flush=False)
    return out


def bench_cuda(l1_dir: Path, nbytes: int, stride: int) -> dict[str, float]:
    """H2D/D2H GB/s between the L1 slots and the GPU, unregistered vs cudaHostRegister'ed:
    one bulk copy of all slots, and one copy per block (the connector's pattern)."""
    import torch

    from ._l1 import open_l1_rank

    n = max(2, nbytes // stride)
    cfg = _config(l1_dir, None, stride, n, 0)
    out: dict[str, float] = {}
    with open_l1_rank(cfg, 0, create=True) as f:
        host = f.torch_view()
        dev = torch.empty((n, stride), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()

        def gbps(fn: object) -> float:
            assert callable(fn)
            with torch.cuda.stream(stream):
                fn()
                stream.synchronize()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record(stream)
                fn()
                end.record(stream)
                end.synchronize()
            return float(n * stride / (start.elapsed_time(end) / 1e3) / GB)

        def measure(tag: str) -> None:
            out[f"cuda_h2d_bulk_{tag}_GBps"] = gbps(lambda: dev.copy_(host, non_blocking=True))
            out[f"cuda_d2h_bulk_{tag}_GBps"] = gbps(lambda: host.copy_(dev, non_blocking=True))
            out[f"cuda_h2d_per_block_{tag}_GBps"] = gbps(
                lambda: [dev[i].copy_(host[i], non_blocking=True) for i in range(n)]
            )
            out[f"cuda_d2h_per_block_{tag}_GBps"] = gbps(
                lambda: [host[i].copy_(dev[i], non_blocking=True) for i in range(n)]
            )

        measure("unregistered")
        out["cuda_registered"] = float(f.register_cuda())
        measure("registered")
        # the bytes made the round trip intact
        f.array[0] = np.arange(stride, dtype=np.uint64).astype(np.uint8)
        dev[1].copy_(host[0])
        host[1].copy_(dev[1])
        torch.cuda.synchronize()
        assert np.array_equal(f.array[0], f.array[1])
        f.unregister_cuda()
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark and print a table."""
    ap = argparse.ArgumentParser(description="kvpool-mmap benchmark")
    ap.add_argument("--size-mb", type=int, default=1024, help="data volume per bandwidth test")
    ap.add_argument("--stride-kb", type=int, default=1024, help="block size (one rank)")
    ap.add_argument("--l1-dir", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--l2-dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--ops", type=int, default=20000, help="blocks per ops/s test")
    ap.add_argument("--index-blocks", type=int, default=100000)
    args = ap.parse_args(argv)
    nbytes = args.size_mb << 20
    stride = args.stride_kb << 10
    l1_root = Path(tempfile.mkdtemp(prefix="kvpool-bench-", dir=args.l1_dir))
    l2_root = Path(tempfile.mkdtemp(prefix="kvpool-bench-", dir=args.l2_dir))
    try:
        print(f"kvpool-mmap bench: {args.size_mb} MiB, stride {args.stride_kb} KiB")
        print(f"  L1 dir {l1_root}  L2 dir {l2_root}")
        res: dict[str, float] = {"memcpy_GBps": bench_memcpy(nbytes)}
        res["dd_write_direct_GBps"], res["dd_read_direct_GBps"] = bench_dd(l2_root, nbytes)
        res.update(bench_tiers(l1_root / "t", l2_root / "t", nbytes, stride))
        res.update(bench_ops(l1_root / "o", args.ops))
        res.update(bench_index_memory(l1_root / "m", l2_root / "m", args.index_blocks))
        from ._cuda import cuda_available

        if cuda_available():
            res.update(bench_cuda(l1_root / "c", nbytes, stride))
        res["ratio_l1_put_vs_memcpy"] = res["l1_put_GBps"] / res["memcpy_GBps"]
        res["ratio_l1_get_vs_memcpy"] = res["l1_get_GBps"] / res["memcpy_GBps"]
        res["ratio_l2_write_vs_dd"] = res["l2_write_GBps"] / res["dd_write_direct_GBps"]
        res["ratio_l2_read_vs_dd"] = res["l2_read_GBps"] / res["dd_read_direct_GBps"]
        for k, v in res.items():
            print(f"  {k:34s} {v:14,.3f}")
    finally:
        shutil.rmtree(l1_root, ignore_errors=True)
        shutil.rmtree(l2_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
