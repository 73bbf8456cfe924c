"""Crash test: a writer process is killed with SIGKILL at random points, then the pool is
reopened and every block it returns is checked against what was written.

    python packages/kvpool-mmap/tests/crash_stress.py --iterations 500 --dir /var/tmp/kvstress \
        [--spawn] [--corrupt]

(`nox -s stress-kvpool` runs it; `tests/test_crash.py` runs a short loop of it in CI.)

With --corrupt, an L2 rank file is also damaged after each kill (bit flips, a zeroed
range, truncation; superblock, headers or payloads): the pool must still open and serve
only correct bytes.

Block contents are a pure function of (key, rank), so the checker knows what every
recovered block must hold without talking to the writer. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import xxhash
from kvpool_mmap import HEADER_BYTES, LoadStatus, StoreConfig, TierConfig, TieredStore

READY_TIMEOUT_S = 60.0
"""How long a writer may take to open its store before the run counts as failed."""


def block_content(key: bytes, rank: int, stride: int) -> np.ndarray:
    """The bytes the writer stores for `key` in rank `rank` (deterministic)."""
    seed = xxhash.xxh64_intdigest(key + rank.to_bytes(2, "little"))
    return np.random.default_rng(seed).integers(0, 256, stride, dtype=np.uint8)


def stress_config(root: Path, stride: int = 65536, tp_size: int = 2) -> StoreConfig:
    """A deliberately tiny pool so that eviction, demotion and L2 slot reuse never stop."""
    return StoreConfig(
        stride=stride,
        engine_id="stress",
        fingerprint=b"stress-v1",
        l1=TierConfig(root / "l1", 8 * stride * tp_size),
        l2=TierConfig(root / "l2", 24 * (stride + HEADER_BYTES) * tp_size),
        tp_size=tp_size,
        io_threads=2,
        l2_fsync="never",
    )


def _key(i: int) -> bytes:
    return xxhash.xxh3_128_digest(i.to_bytes(8, "little")) + b"\x00\x01"


def run_writer(config: StoreConfig, seed: int, ready_fd: int | None = None) -> None:
    """Store random chains forever (until killed), re-storing evicted keys now and then."""
    rng = random.Random(seed)
    store = TieredStore(config)
    if ready_fd is not None:
        os.write(ready_fd, b"r")
        os.close(ready_fd)
    stride = config.stride
    while True:
        start = rng.randrange(0, 400)
        keys = [_key(start + j) for j in range(rng.randint(1, 6))]
        ticket = store.begin_store(keys)
        for k, slot in ticket.allocated:
            for r, f in enumerate(store.l1_files):
                f.array[slot] = block_content(k, r, stride)
        store.commit_store(ticket)
        if rng.random() < 0.3:
            load = store.begin_load(keys)
            store.wait_load(load, timeout=5)
            store.end_load(load)
        store.tick()


@dataclass
class CheckResult:
    """What one reopen after a kill found."""

    recovered: int = 0
    verified: int = 0
    wrong: int = 0
    checksum_failures: int = 0
    discarded: int = 0
    startup_kill: bool = False
    damage: str = ""
    errors: list[str] = field(default_factory=list)


def check_pool(config: StoreConfig) -> CheckResult:
    """Reopen the pool (new L1), load every recovered block, compare with the truth."""
    res = CheckResult()
    with TieredStore(config) as store:
        res.recovered = len(store.recovery.blocks)
        res.discarded = store.stats().recovery_discarded
        for b in store.recovery.blocks:
            ticket = store.begin_load([b.key])
            status = store.wait_load(ticket, timeout=10)
            if status is LoadStatus.READY:
                for r, f in enumerate(store.l1_files):
                    got = f.array[ticket.l1_slots[0]]
                    if not np.array_equal(got, block_content(b.key, r, config.stride)):
                        res.wrong += 1
                        res.errors.append(f"slot {b.slot} rank {r}: wrong bytes returned")
                res.verified += 1
            store.end_load(ticket)
        res.checksum_failures = store.stats().checksum_failures
    left = sorted(p.name for p in Path(config.l1.path).iterdir())
    if left:  # the killed writer's L1 must have been reclaimed, ours removed on close
        res.errors.append(f"files left in the L1 directory: {left}")
    return res


def _spawn_writer(config: StoreConfig, seed: int, wait: bool = True) -> subprocess.Popen[bytes]:
    spec = json.dumps(
        {
            **{k: v for k, v in asdict(config).items() if k not in ("l1", "l2", "fingerprint")},
            "l1": {"path": str(config.l1.path), "bytes_to_use": config.l1.bytes_to_use},
            "l2": {"path": str(config.l2.path), "bytes_to_use": config.l2.bytes_to_use}
            if config.l2
            else None,
            "fingerprint": config.fingerprint.decode(),
        }
    )
    proc = subprocess.Popen(
        [sys.executable, __file__, "--writer", spec, "--seed", str(seed)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    if not wait:
        return proc
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    if not ready or proc.stdout.read(1) != b"r":
        proc.kill()
        raise RuntimeError(f"writer did not start (exit {proc.wait()})")
    return proc


def _fork_writer(config: StoreConfig, seed: int, wait: bool = True) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        os.close(r)
        code = 0
        try:
            run_writer(config, seed, ready_fd=w)
        except BaseException:
            code = 3
        os._exit(code)
    os.close(w)
    if not wait:
        os.close(r)
        return pid
    try:
        ready, _, _ = select.select([r], [], [], READY_TIMEOUT_S)
        if not ready or os.read(r, 1) != b"r":
            os.kill(pid, signal.SIGKILL)  # hung (e.g. a lock inherited through fork) or died
            _, status = os.waitpid(pid, 0)
            raise RuntimeError(f"writer did not start (status {status})")
    finally:
        os.close(r)
    return pid


STARTUP_KILLS = 0.2
"""Share of iterations that kill the writer while it may still be opening the store
(creating L1, recovering L2) instead of after it reported ready."""


DAMAGE = ("flip", "zero", "truncate")


def damage_l2(config: StoreConfig, rng: random.Random) -> str:
    """Damage one L2 rank file at random: flip bits, zero a range, or cut it short
    (anywhere: superblock, header table or payloads). Returns what was done."""
    path = config.l2_file(rng.randrange(config.tp_size))
    size = path.stat().st_size
    kind = rng.choice(DAMAGE)
    start = rng.randrange(size)
    length = min(size - start, rng.choice((1, 64, 4096, 65536)))
    with open(path, "r+b") as f:
        if kind == "truncate":
            f.truncate(start)
        else:
            f.seek(start)
            data = bytearray(f.read(length))
            for i in range(len(data)):
                data[i] = 0 if kind == "zero" else data[i] ^ (1 << rng.randrange(8))
            f.seek(start)
            f.write(data)
    return f"{kind} {length} B at {start} of {path.name}"


def crash_iteration(
    config: StoreConfig, rng: random.Random, spawn: bool = False, corrupt: bool = False
) -> CheckResult:
    """Start a writer, SIGKILL it after a random delay, optionally damage L2, reopen and
    check (with damage, checksum failures are expected; wrong bytes never are)."""
    delay = rng.uniform(0.005, 0.25)
    wait = rng.random() >= STARTUP_KILLS
    if spawn:
        proc = _spawn_writer(config, rng.randrange(1 << 30), wait)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    else:
        pid = _fork_writer(config, rng.randrange(1 << 30), wait)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    damage = damage_l2(config, rng) if corrupt else ""
    result = check_pool(config)
    result.startup_kill = not wait
    result.damage = damage
    return result


def run(
    iterations: int, root: Path, seed: int = 0, spawn: bool = False, corrupt: bool = False
) -> list[CheckResult]:
    """`iterations` kill/reopen cycles on one pool directory."""
    config = stress_config(root)
    rng = random.Random(seed)
    return [crash_iteration(config, rng, spawn, corrupt) for _ in range(iterations)]


def main(argv: list[str] | None = None) -> int:
    """Command line: run the crash loop, print a summary, exit 1 on any failure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spawn", action="store_true", help="separate interpreter per writer")
    ap.add_argument("--corrupt", action="store_true", help="also damage an L2 file after each kill")
    ap.add_argument("--writer", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.writer:
        config = StoreConfig.from_dict(json.loads(args.writer))
        run_writer(config, args.seed, ready_fd=sys.stdout.fileno())
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t0 = time.monotonic()
        results = run(args.iterations, Path(tmp), args.seed, args.spawn, args.corrupt)
    bad = [r for r in results if r.wrong or r.errors or (r.checksum_failures and not r.damage)]
    total = sum(r.verified for r in results)
    print(
        f"{len(results)} kill -9 iterations "
        f"({sum(r.startup_kill for r in results)} during start-up) "
        f"in {time.monotonic() - t0:.1f}s: "
        f"{total} recovered blocks verified, "
        f"{sum(r.discarded for r in results)} slots discarded at recovery, "
        f"{sum(r.wrong for r in results)} wrong, "
        f"{sum(r.checksum_failures for r in results)} checksum failures"
        + (" (damaged payloads, caught)" if args.corrupt else "")
    )
    for r in bad[:10]:
        print("FAILED:", r)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
