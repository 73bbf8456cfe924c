"""Benchmark: hit rate of a multi-turn workload through a full L1 in front of a slower L2.

    python -m kvpool_mmap.bench_overload [--sessions 24] [--blocks 24] [--growth 2]
        [--rounds 4] [--stride-kb 256] [--l1-fraction 0.33] [--store-ratio 2]
        [--policy auto] [--l1-dir /dev/shm] [--l2-dir /var/tmp] [--order shuffled|cyclic]
        [--load-l2] [--modes l1_only,demote,drop_unwritten] [--json FILE]

Sessions of `--blocks` blocks grow by `--growth` blocks a round and come back in a
shuffled order each round (`--order cyclic`: the same order, as the GPU multi-turn
benchmark sends them): a session looks up its whole history (the longest cached prefix is
a hit; L2 blocks are promoted), then stores its whole prompt (the store skips what it
holds). Stores arrive at `--store-ratio` times the L2 write rate (docs/benchmarks.md has
the GPU host's ratio), paced by sleeping after each session. L2 writes are real writes
capped at `--l2-write-mbps` (default 50 MB/s; 0: the disk's own rate, measured first) so
that runs on a shared machine, whose disk speed varies, compare. L1 holds
`--l1-fraction` of the final live context, L2 all of it; both tiers evict with
`--policy`. The stores of `--modes` run the same workload with the same seed: L1 only (the
bound an L2 should not fall below), and L1 + L2 under each `l1_overflow` mode. Hit rate =
blocks hit / blocks looked up, rounds 1 onward (and per round); fresh = share of each
prompt cached (either tier) right after it was stored: what a repeat of the prompt, or a
request sharing it, would find.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._config import HEADER_BYTES, L1_OVERFLOW_MODES, StoreConfig, TierConfig
from ._io import BlockMover
from ._store import TieredStore
from ._types import LoadStatus, Tier


@dataclass
class Result:
    """One store's run of the workload."""

    mode: str
    hit_rate: float
    round_hit_rates: list[float]
    """Hit rate of each warm round."""
    l1_hit_rate: float
    l2_hit_rate: float
    fresh_rate: float
    """Share of each prompt cached right after it was stored (what an immediate repeat hits)."""
    looked_up: int
    stored: int
    not_stored: int
    dropped_unwritten: int
    restores: int
    demotions: int
    write_throughs: int
    wall_s: float


MODES = ("l1_only", *reversed(L1_OVERFLOW_MODES))
"""The stores compared: L1 alone, then L1 + L2 under each `l1_overflow` mode."""


def _key(session: int, block: int) -> bytes:
    return session.to_bytes(4, "little") + block.to_bytes(4, "little") + bytes(26)


def _config(
    l1_dir: Path,
    l2_dir: Path | None,
    stride: int,
    l1_slots: int,
    l2_slots: int,
    mode: str,
    policy: str = "auto",
) -> StoreConfig:
    payload = -(-stride // 4096) * 4096 + HEADER_BYTES
    return StoreConfig(
        stride=stride,
        engine_id=f"overload-{mode}",
        fingerprint=b"bench-overload",
        l1=TierConfig(l1_dir, l1_slots * stride),
        l2=TierConfig(l2_dir, l2_slots * payload) if l2_dir is not None else None,
        eviction_policy=policy,
        l1_overflow=mode if mode in L1_OVERFLOW_MODES else "drop_unwritten",  # type: ignore[arg-type]
    )


class CappedWrites:
    """Caps the store's L2 writes at `bytes_per_s` in total (each a real write, then a wait
    for its turn), so that runs on a shared machine compare: the disk's own speed varies."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self._next = 0.0
        self._lock = threading.Lock()
        self._write = BlockMover.write_block

    def __enter__(self) -> CappedWrites:
        capped = self

        def write_block(mover: BlockMover, *args: Any) -> list[int]:
            out = capped._write(mover, *args)
            with capped._lock:
                now = time.monotonic()
                capped._next = max(capped._next, now) + mover.stride / capped.bytes_per_s
                wait = capped._next - now
            time.sleep(wait)
            return out

        BlockMover.write_block = write_block  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        BlockMover.write_block = self._write  # type: ignore[method-assign]


def measure_l2_write(l1_dir: Path, l2_dir: Path, stride: int, blocks: int) -> float:
    """Bytes/s of the store's own L2 writes (write-through + flush) on this disk."""
    config = _config(l1_dir, l2_dir, stride, blocks, blocks, "measure")
    data = np.random.default_rng(0).integers(0, 256, (blocks, stride), dtype=np.uint8)
    with TieredStore(config) as store:
        start = time.perf_counter()
        store.put([_key(0, i) for i in range(blocks)], data)
        store.flush()
        return blocks * stride / (time.perf_counter() - start)


def run(
    store: TieredStore, mode: str, args: argparse.Namespace, store_bytes_per_s: float
) -> Result:
    """The workload of the module docstring on one store."""
    stride = store.config.stride
    rng = random.Random(args.seed)
    payload = np.random.default_rng(args.seed).integers(
        0, 256, (args.blocks + args.growth * args.rounds, stride), dtype=np.uint8
    )
    hits = {Tier.L1: 0, Tier.L2: 0}
    looked_up = stored = fresh = prompts = 0
    round_hit_rates = []
    start = time.perf_counter()
    for round_ in range(args.rounds + 1):
        round_start = (hits[Tier.L1] + hits[Tier.L2], looked_up)
        order = list(range(args.sessions))
        if args.order == "shuffled":
            rng.shuffle(order)
        length = args.blocks + args.growth * round_
        for session in order:
            began = time.perf_counter()
            keys = [_key(session, b) for b in range(length)]
            hit = 0
            if round_ > 0:
                history = keys[: length - args.growth]
                looked_up += len(history)
                if not args.load_l2:  # the L2 part is recomputed: only the L1 prefix loads
                    tiers = store.lookup(history)
                    history = history[: ([*tiers, Tier.L2]).index(Tier.L2)]
                ticket = store.begin_load(history)
                if store.wait_load(ticket, timeout=60) is not LoadStatus.PENDING:
                    hit = ticket.ready_prefix
                    for tier in ticket.tiers[:hit]:
                        hits[tier] += 1
                store.end_load(ticket)
            stored += store.put(keys, payload[:length])  # the hit is stored already
            fresh += len(store.lookup(keys))
            prompts += length
            store.tick()
            prefill_s = (length - hit) * stride / store_bytes_per_s
            time.sleep(max(0.0, prefill_s - (time.perf_counter() - began)))
        if round_ > 0:
            round_hits = hits[Tier.L1] + hits[Tier.L2] - round_start[0]
            round_hit_rates.append(round_hits / max(looked_up - round_start[1], 1))
    wall = time.perf_counter() - start
    st = store.stats()
    total = max(looked_up, 1)
    return Result(
        mode=mode,
        hit_rate=(hits[Tier.L1] + hits[Tier.L2]) / total,
        round_hit_rates=round_hit_rates,
        l1_hit_rate=hits[Tier.L1] / total,
        l2_hit_rate=hits[Tier.L2] / total,
        fresh_rate=fresh / max(prompts, 1),
        looked_up=looked_up,
        stored=stored,
        not_stored=st.store_no_space,
        dropped_unwritten=st.dropped_unwritten,
        restores=st.restores,
        demotions=st.demotions,
        write_throughs=st.write_throughs,
        wall_s=wall,
    )


def main(argv: list[str] | None = None) -> int:
    """Run the three stores and print a table (and JSON with --json)."""
    ap = argparse.ArgumentParser(description="kvpool-mmap: overloaded L1 with a slower L2")
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--blocks", type=int, default=24, help="blocks per session in round 0")
    ap.add_argument("--growth", type=int, default=2, help="blocks a session adds per round")
    ap.add_argument("--rounds", type=int, default=4, help="warm rounds after the cold one")
    ap.add_argument("--stride-kb", type=int, default=256, help="block size")
    ap.add_argument("--l1-fraction", type=float, default=0.33, help="of the final live context")
    ap.add_argument("--store-ratio", type=float, default=2.0, help="store rate / L2 write rate")
    ap.add_argument(
        "--l2-write-mbps",
        type=float,
        default=50.0,
        help="cap L2 writes at this many MB/s (below the disk's measured rate) so runs on a "
        "shared machine compare; 0: the disk's own, varying, speed",
    )
    ap.add_argument("--l1-dir", type=Path, default=Path("/dev/shm"))
    ap.add_argument("--l2-dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument(
        "--load-l2",
        action="store_true",
        help="load L2 hits (default: recompute them, as the connector's cost model does "
        "when the disk reads slower than the GPU prefills, e.g. on the H200)",
    )
    ap.add_argument(
        "--order",
        choices=("shuffled", "cyclic"),
        default="shuffled",
        help="sessions per round: shuffled, or always the same order (as multiturn_bench.py)",
    )
    ap.add_argument("--policy", default="auto", help="eviction policy of both tiers")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated stores to run, of {', '.join(MODES)}",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        ap.error(f"unknown --modes {sorted(unknown)}; accepted: {', '.join(MODES)}")
    stride = args.stride_kb << 10
    live = args.sessions * (args.blocks + args.growth * args.rounds)
    l1_slots = max(1, int(live * args.l1_fraction))
    results = []
    with (
        tempfile.TemporaryDirectory(dir=args.l1_dir) as l1,
        tempfile.TemporaryDirectory(dir=args.l2_dir) as l2,
    ):
        disk = measure_l2_write(Path(l1), Path(l2), stride, min(l1_slots, 256))
        if args.l2_write_mbps:
            disk = min(disk, args.l2_write_mbps * 1e6)
        rate = disk * args.store_ratio
        with CappedWrites(disk if args.l2_write_mbps else float("inf")):
            for mode in args.modes.split(","):
                l2_dir = None if mode == "l1_only" else Path(l2)
                config = _config(Path(l1), l2_dir, stride, l1_slots, 2 * live, mode, args.policy)
                with TieredStore(config) as store:
                    results.append(run(store, mode, args, rate))
    print(
        f"{args.sessions} sessions x {args.blocks}+{args.growth}/round blocks of {args.stride_kb} KiB, "
        f"{args.rounds} warm rounds; L1 {l1_slots} of {live} blocks; L2 writes "
        f"{disk / 1e9:.2f} GB/s, stores paced at {rate / 1e9:.2f} GB/s"
    )
    print(
        f"{'mode':<15} {'hit rate':>8} {'L1':>6} {'L2':>6} {'fresh':>6} {'not_stored':>10} "
        f"{'dropped':>8} {'restored':>8} {'demoted':>8} {'wall s':>7}  per round"
    )
    for r in results:
        print(
            f"{r.mode:<15} {r.hit_rate:>8.1%} {r.l1_hit_rate:>6.1%} {r.l2_hit_rate:>6.1%} "
            f"{r.fresh_rate:>6.1%} {r.not_stored:>10} {r.dropped_unwritten:>8} {r.restores:>8} {r.demotions:>8} {r.wall_s:>7.2f}  "
            + " / ".join(f"{h:.1%}" for h in r.round_hit_rates)
        )
    if args.json:
        info = {"l2_write_GBps": disk / 1e9, "store_GBps": rate / 1e9, "l1_slots": l1_slots}
        out = {"args": {k: str(v) for k, v in vars(args).items()}, **info}
        out["results"] = [asdict(r) for r in results]
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
