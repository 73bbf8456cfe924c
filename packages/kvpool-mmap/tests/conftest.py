"""Shared fixtures: configs on real files in a temporary directory."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from kvpool_mmap import (
    HEADER_BYTES,
    L1RankFile,
    StoreConfig,
    TierConfig,
    TieredStore,
    open_l1_rank,
)
from kvpool_mmap._io import BlockMover

STRIDE = 4096

# no example database in the checkout, no per-example deadline on a shared 2-core box
settings.register_profile("kvpool", database=None, deadline=None)
settings.load_profile("kvpool")

MakeConfig = Callable[..., StoreConfig]


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """make_config(l1_slots=8, l2_slots=32, tp_size=1, **overrides) -> StoreConfig."""

    def make(
        l1_slots: int = 8,
        l2_slots: int | None = 32,
        tp_size: int = 1,
        stride: int = STRIDE,
        root: Path = tmp_path,
        **overrides: Any,
    ) -> StoreConfig:
        payload = -(-stride // 4096) * 4096
        kwargs: dict[str, Any] = dict(
            stride=stride,
            engine_id="test",
            fingerprint=b"model=tiny;dtype=bf16;block=16",
            l1=TierConfig(root / "l1", l1_slots * stride * tp_size),
            l2=TierConfig(root / "l2", l2_slots * (payload + HEADER_BYTES) * tp_size)
            if l2_slots
            else None,
            tp_size=tp_size,
            io_threads=2,
        )
        kwargs.update(overrides)
        return StoreConfig(**kwargs)

    return make


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root and mount privileges; skipped otherwise)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN?): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def store_factory() -> Iterator[Callable[..., TieredStore]]:
    """Open stores that are closed at teardown."""
    opened: list[TieredStore] = []

    def open_store(config: StoreConfig, **kwargs: Any) -> TieredStore:
        s = TieredStore(config, **kwargs)
        opened.append(s)
        return s

    yield open_store
    for s in opened:
        s.close(flush=False)


def key(i: int) -> bytes:
    """A 34-byte key like vLLM's (32-byte block hash + 2-byte group)."""
    return i.to_bytes(32, "big") + b"\x00\x00"


def block(i: int, tp: int = 1, stride: int = STRIDE) -> np.ndarray:
    """Deterministic block contents [tp, stride] for key(i)."""
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, (tp, stride), dtype=np.uint8)


def _hold(config: StoreConfig, what: str, conn: Connection) -> None:
    """Child: own the pool like a running engine (a worker's L1 file, or a whole store)."""
    if what == "l1":
        held: L1RankFile | TieredStore = open_l1_rank(config, 0, create=True)
    else:
        held = TieredStore(config)
        held.put([key(1)], block(1)[None])
        held.flush()
    conn.send(os.getpid())
    conn.recv()  # until told to exit (or killed)
    held.close()


class Holder:
    """A real second process that holds a pool until stopped or killed."""

    def __init__(self, config: StoreConfig, what: str) -> None:
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_hold, args=(config, what, child), daemon=True)
        self.process.start()
        assert self._conn.poll(60), "holder did not start"
        self.pid: int = self._conn.recv()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.process.join(10)

    def stop(self) -> None:
        if self.process.is_alive():
            self._conn.send("exit")
            self.process.join(10)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        if h.process.is_alive():
            h.kill()


def hold_l2_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make every L2 write wait (at most 10 s) on its I/O thread until the returned gate is set."""
    gate = threading.Event()
    write = BlockMover.write_block

    def held(self: BlockMover, *args: object) -> list[int]:
        gate.wait(10)
        return write(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(BlockMover, "write_block", held)
    return gate
