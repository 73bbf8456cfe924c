"""The L1 rank file: one mmap'd file per tensor-parallel rank, slots as zero-copy views.

Layout: one superblock page, then `num_slots * stride` bytes of slots (slot s at
PAGE + s * stride). Slot indices are the same in every rank file of an engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from . import _cuda, _prefault
from ._codec import L1_MAGIC, Superblock, describe_mismatch, expected_superblock
from ._config import PAGE, StoreConfig, prepare_dir
from ._errors import LayoutMismatchError
from ._lock import lock_or_raise, same_file
from ._pools import naming_stale_files, remove_if_stale, remove_stale_l1
from ._slab import close_map, map_file, open_pool_file, read_page0, reserve

log = logging.getLogger("kvpool_mmap")


class L1RankFile:
    """One rank's L1 file, mapped read/write.

    Threading: the mapping is shared; distinct slots may be read and written from any
    thread or process. The store decides who may touch which slot (see TieredStore).
    """

    def __init__(
        self, config: StoreConfig, rank: int, *, create: bool, populate: bool | None = None
    ) -> None:
        config.check_tp_rank(rank)
        prepare_dir(config.l1.path, config.key("l1.path"))
        self.config = config
        self.rank = rank
        self.stride = config.stride
        self.num_slots = config.l1_slots
        self.path = config.l1_file(rank)
        self.created = create
        want = expected_superblock(config, rank, L1_MAGIC, self.num_slots, config.stride)
        self.data_offset = want.data_offset
        size = self.data_offset + self.num_slots * self.stride
        populate = create if populate is None else populate
        in_parallel = populate and _prefault.supported()
        if create:
            remove_stale_l1(self.path.parent)  # their memory is free before ours is reserved
            with naming_stale_files(self.path.parent):
                self._fd = _create_locked(
                    self.path,
                    size,
                    want.encode(),
                    config.key("l1.bytes_to_use"),
                    config.key("l1.path"),
                    f"Every running engine needs its own {config.key('engine_id')} "
                    f"(now {config.engine_id!r}) or its own {config.key('l1.path')}.",
                    allocate=not in_parallel,
                )
        else:
            try:
                self._fd = open_pool_file(self.path, config.key("l1.path"), create=False)
            except FileNotFoundError:
                raise LayoutMismatchError(
                    f"L1 file {self.path} for tp rank {rank} does not exist: the worker of "
                    "that rank must call open_l1_rank(config, rank, create=True) before the "
                    "store attaches (or construct TieredStore(config) with create_l1=True)"
                ) from None
        try:
            found = Superblock.decode(read_page0(self._fd, PAGE), L1_MAGIC)
            if found != want:
                raise LayoutMismatchError(
                    f"L1 file {self.path} does not match this config: "
                    f"{describe_mismatch(found, want)}"
                )
            if os.fstat(self._fd).st_size < size:
                raise LayoutMismatchError(f"L1 file {self.path} is shorter than {size} bytes")
            self._mm = map_file(self._fd, size, populate=populate and not in_parallel)
            if in_parallel:
                with naming_stale_files(self.path.parent):
                    _prefault.populate(
                        self._mm,
                        self.data_offset,
                        size - self.data_offset,
                        self.path,
                        config.key("l1.bytes_to_use"),
                    )
        except BaseException:
            if create:
                _unlink_if_same(self.path, self._fd)
            os.close(self._fd)
            raise
        st = os.fstat(self._fd)
        self._unlink_at_exit = (
            weakref.finalize(self, _unlink_if_inode, self.path, st.st_ino, st.st_dev, os.getpid())
            if create
            else None
        )
        """Removes the file at interpreter exit if close() was never called (creator only)."""
        self.array: np.ndarray = np.frombuffer(
            self._mm, dtype=np.uint8, count=self.num_slots * self.stride, offset=self.data_offset
        ).reshape(self.num_slots, self.stride)
        """uint8 [num_slots, stride]; a zero-copy view of the file."""
        self._registered = False
        self._closed = False

    def slot(self, index: int) -> np.ndarray:
        """uint8 [stride] view of one slot."""
        view: np.ndarray = self.array[index]
        return view

    def buffer(self, index: int) -> memoryview:
        """Writable memoryview of one slot (for os.preadv / os.pwrite)."""
        start = self.data_offset + index * self.stride
        return memoryview(self._mm)[start : start + self.stride]

    def replaced(self) -> bool:
        """True if another file now sits at `path` (re-created by another process): this
        mapping no longer shares memory with the processes that open the path.

        A removed name is not a replacement: every process that mapped the file still
        shares its memory (callers unlink anonymous pools once all of them have it mapped).
        """
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self._fd)
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)

    def torch_view(self) -> Any:
        """torch.uint8 [num_slots, stride] sharing memory with the file (needs torch)."""
        return _cuda.torch_from_numpy(self.array)

    def register_cuda(self) -> bool:
        """Page-lock the slots for DMA (cudaHostRegister). False (no-op) without CUDA."""
        if self._registered:
            return True
        self._registered = _cuda.host_register(self.array.ctypes.data, self.array.nbytes)
        return self._registered

    def unregister_cuda(self) -> None:
        """Undo register_cuda (no-op if not registered)."""
        if self._registered:
            _cuda.host_unregister(self.array.ctypes.data)
            self._registered = False

    def close(self, unlink: bool | None = None) -> None:
        """Unmap (views still alive keep the memory) and release the file.

        unlink (default: whether this handle created the file) removes the file if it is
        still the one mapped here. L1 is scratch memory: its contents mean nothing without
        the store's index, so a creator removes it on close and a later start makes a new
        one (files of owners that died without closing are removed then).
        """
        if self._closed:
            return
        self._closed = True
        self.unregister_cuda()
        del self.array
        close_map(self._mm)
        if self.created if unlink is None else unlink:
            _unlink_if_same(self.path, self._fd)
        if self._unlink_at_exit is not None:
            self._unlink_at_exit.detach()
        os.close(self._fd)  # releases the lock

    def __enter__(self) -> L1RankFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create_locked(
    path: Path,
    size: int,
    first_page: bytes,
    setting: str,
    setting_path: str,
    hint: str,
    *,
    allocate: bool = True,
) -> int:
    """Create `path` anew, locked by this process; return its open, locked descriptor.

    The lock is taken before anything is changed: if a live owner holds the file,
    PoolInUseError names it (with `hint`) and the file is left alone; a path that is no
    regular file is a ConfigError naming `setting_path`. A file at `path`
    whose owner died is removed first, so its space is free before the new file
    reserves its own (the budget is never needed twice). The superblock is written last:
    until then the file fails every attach check. Processes that still map a removed
    file keep its memory. allocate=False only checks the space and sizes the file, for a
    caller that faults it in itself (`_prefault.populate`).
    """
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            remove_if_stale(path, setting_path, hint)
            continue
        try:
            lock_or_raise(fd, path, hint)
            if not same_file(fd, path):  # removed as stale before we locked it: again
                os.close(fd)
                continue
            if allocate:
                reserve(fd, size, path, setting)
            else:
                _prefault.claim(fd, size, path, setting)
            os.pwrite(fd, first_page, 0)
        except BaseException:
            _unlink_if_same(path, fd)
            os.close(fd)
            raise
        return fd


def _unlink_if_same(path: Path, fd: int) -> None:
    """Remove `path` if it still names the open file `fd`."""
    if same_file(fd, path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _unlink_if_inode(path: Path, ino: int, dev: int, creator: int) -> None:
    if os.getpid() != creator:  # a forked child exiting must not remove its parent's file
        return
    with contextlib.suppress(OSError):
        st = os.stat(path, follow_symlinks=False)
        if (st.st_ino, st.st_dev) == (ino, dev):
            os.unlink(path)


def open_l1_rank(
    config: StoreConfig, rank: int, create: bool = True, populate: bool | None = None
) -> L1RankFile:
    """Map tensor-parallel rank `rank`'s L1 file.

    create=True (a vLLM worker at start-up, or a standalone store) locks the file for
    this process (PoolInUseError naming the owner if a running engine holds it; nothing
    is changed then), removes stale L1 files of dead owners in the directory, and makes
    the file fresh, reserving its space (InsufficientSpaceError if the tmpfs is too
    small); the file is removed again on close() or at interpreter exit. create=False
    attaches to an existing file and raises LayoutMismatchError if it is missing or was
    made for another geometry, engine or fingerprint. populate (default: create) pre-faults
    the mapping so GPU copies never fault (on several threads where the kernel supports
    MADV_POPULATE_WRITE, else MAP_POPULATE); the scheduler-side store, which
    maps every rank only for L2 transfers, attaches without it.
    """
    return L1RankFile(config, rank, create=create, populate=populate)
