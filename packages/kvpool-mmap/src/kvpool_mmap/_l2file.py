"""The L2 rank file: superblock, header table, page-aligned payloads; positional I/O only.

Layout: page 0 superblock | header table (num_slots * HEADER_BYTES, page rounded) |
payloads (num_slots * payload_bytes, each page aligned).

The file is locked (flock, exclusive) while open, so a second process configured with the
same engine id and directory fails at once (PoolInUseError) instead of corrupting it.

Threading: every method except open/close may be called from several threads at once for
distinct slots; the store orders operations on one slot.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from pathlib import Path

import numpy as np

from ._codec import (
    EMPTY_HEADER,
    L2_MAGIC,
    Superblock,
    describe_mismatch,
    expected_superblock,
)
from ._config import HEADER_BYTES, PAGE, StoreConfig, prepare_dir
from ._errors import LayoutMismatchError
from ._lock import lock_or_raise, same_file
from ._pools import naming_stale_files
from ._slab import open_pool_file, read_exact, reserve, write_all

log = logging.getLogger("kvpool_mmap")


class L2RankFile:
    """One rank's L2 file, opened (and wiped if written under another layout)."""

    def __init__(self, config: StoreConfig, rank: int, wipe: bool = True) -> None:
        assert config.l2 is not None
        prepare_dir(config.l2.path, config.key("l2.path"))
        want = expected_superblock(config, rank, L2_MAGIC, config.l2_slots, config.l2_payload_bytes)
        self._setup(config.l2_file(rank), want)
        self._fd = open_pool_file(self.path, config.key("l2.path"), create=True)
        self._dfd = -1
        try:
            lock_or_raise(
                self._fd,
                self.path,
                f"Every running engine needs its own {config.key('engine_id')} "
                f"(now {config.engine_id!r}) or its own {config.key('l2.path')}.",
            )
            self._open_or_wipe(wipe, config.key("l2.bytes_to_use"))
            self._dfd = self._open_direct(config)
        except BaseException:
            self._close_fds()
            raise
        self.direct = self._dfd != self._fd

    @classmethod
    def open_existing(cls, path: Path) -> L2RankFile:
        """Open a pool file by its path alone (offline tools): locked, geometry from its
        own superblock, page-cache I/O. LayoutMismatchError if it is no valid L2 file;
        PoolInUseError if a running engine holds it."""
        self = cls.__new__(cls)
        self._fd = open_pool_file(path, "path", create=False)
        self._dfd = -1
        try:
            lock_or_raise(self._fd, path, "Stop that engine first.")
            found = Superblock.decode(os.pread(self._fd, PAGE, 0), L2_MAGIC)
            self._setup(path, found)
            if os.fstat(self._fd).st_size < self.size:
                raise LayoutMismatchError(f"L2 file {path} is shorter than {self.size} bytes")
        except BaseException:
            self._close_fds()
            raise
        self._dfd = self._fd
        self.direct = False
        return self

    def _setup(self, path: Path, want: Superblock) -> None:
        self.path = path
        self.rank = want.tp_rank
        self.num_slots = want.num_slots
        self.stride = want.stride
        self.payload_bytes = want.payload_bytes
        self.want = want
        self.header_offset = want.header_offset
        self.data_offset = want.data_offset
        self.size = self.data_offset + self.num_slots * self.payload_bytes
        self.wiped = False

    def _open_or_wipe(self, wipe: bool, budget_key: str) -> None:
        st = os.fstat(self._fd)
        reason = ""
        if st.st_size == 0:
            reason = "new"
        else:
            try:
                found = Superblock.decode(os.pread(self._fd, PAGE, 0), L2_MAGIC)
                if found != self.want:
                    reason = describe_mismatch(found, self.want)
            except LayoutMismatchError as exc:
                reason = str(exc)
            if not reason and st.st_size < self.size:
                reason = f"file is {st.st_size} bytes, expected {self.size}"
        if not reason:
            return
        if not wipe:
            what = "is empty: no pool was written here" if reason == "new" else reason
            raise LayoutMismatchError(f"L2 file {self.path} {what}")
        if reason != "new":
            log.warning(
                "L2 file %s was written under another layout (%s); wiping it", self.path, reason
            )
        self.wiped = reason != "new"
        # Invalidate first: a crash while wiping leaves a file that fails the superblock check.
        write_all(self._fd, bytes(PAGE), 0)
        os.ftruncate(self._fd, 0)
        try:
            with naming_stale_files(self.path.parent):
                reserve(self._fd, self.size, self.path, budget_key)
        except BaseException:
            os.ftruncate(self._fd, 0)  # give back whatever was allocated
            if reason == "new" and same_file(self._fd, self.path):
                os.unlink(self.path)  # a refused new pool leaves nothing behind
            raise
        os.fdatasync(self._fd)
        write_all(self._fd, self.want.encode(), 0)
        os.fdatasync(self._fd)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _open_direct(self, config: StoreConfig) -> int:
        if config.direct_io == "off":
            return self._fd
        aligned = config.stride % PAGE == 0
        if aligned:
            try:
                return os.open(self.path, os.O_RDWR | os.O_DIRECT)
            except OSError as exc:
                if config.direct_io == "on":
                    raise LayoutMismatchError(
                        f"direct_io='on' but {self.path} cannot be opened with O_DIRECT: {exc}"
                    ) from exc
                return self._fd
        if config.direct_io == "on":
            raise LayoutMismatchError(
                f"direct_io='on' needs stride to be a multiple of {PAGE}, got {config.stride}"
            )
        return self._fd

    # --- headers ----------------------------------------------------------------------

    def read_header_table(self) -> np.ndarray:
        """uint8 [num_slots, HEADER_BYTES]: the whole header table in one read."""
        raw = os.pread(self._fd, self.num_slots * HEADER_BYTES, self.header_offset)
        if len(raw) != self.num_slots * HEADER_BYTES:
            raise OSError(errno.EIO, f"short read of the header table of {self.path}")
        return np.frombuffer(raw, dtype=np.uint8).reshape(self.num_slots, HEADER_BYTES)

    def write_header(self, slot: int, header: bytes) -> None:
        """Write one header-table entry (EMPTY_HEADER invalidates the slot)."""
        write_all(self._fd, header, self.header_offset + slot * HEADER_BYTES)

    def invalidate(self, slot: int) -> None:
        """Mark a slot empty."""
        self.write_header(slot, EMPTY_HEADER)

    # --- payloads ---------------------------------------------------------------------

    def payload_offset(self, slot: int) -> int:
        """Byte offset of a slot's payload."""
        return self.data_offset + slot * self.payload_bytes

    def _needs_bounce(self, buf: memoryview) -> bool:
        if not self.direct:
            return False
        addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
        return addr % PAGE != 0 or len(buf) % PAGE != 0

    def write_payload(self, slot: int, data: memoryview) -> None:
        """Write `stride` bytes (O_DIRECT when enabled; unaligned buffers are bounced)."""
        if self._needs_bounce(data):
            with mmap.mmap(-1, self.payload_bytes) as bounce:
                bounce[: len(data)] = data
                with memoryview(bounce) as view:
                    write_all(self._dfd, view[: self.payload_bytes], self.payload_offset(slot))
            return
        write_all(self._dfd, data, self.payload_offset(slot))

    def read_payload(self, slot: int, into: memoryview) -> None:
        """Read `stride` bytes into `into` (O_DIRECT when enabled; unaligned: bounced)."""
        if self._needs_bounce(into):
            with mmap.mmap(-1, self.payload_bytes) as bounce:
                with memoryview(bounce) as view:
                    read_exact(self._dfd, view[: self.payload_bytes], self.payload_offset(slot))
                into[:] = bounce[: len(into)]
            return
        read_exact(self._dfd, into, self.payload_offset(slot))

    def read_payload_copy(self, slot: int) -> bytes:
        """Read a payload into a fresh page-aligned buffer and return its bytes."""
        buf = mmap.mmap(-1, max(self.payload_bytes, PAGE))
        try:
            view = memoryview(buf)[: self.stride]
            self.read_payload(slot, view)
            out = bytes(view)
            view.release()
        finally:
            buf.close()
        return out

    def sync(self) -> None:
        """fdatasync the file (payloads and headers)."""
        os.fdatasync(self._fd)

    def drop_cache(self) -> None:
        """Ask the kernel to drop this file's cached pages (after sync; buffered mode only)."""
        if not self.direct:
            os.posix_fadvise(self._fd, self.data_offset, 0, os.POSIX_FADV_DONTNEED)

    def _close_fds(self) -> None:
        if self._dfd not in (-1, self._fd):
            os.close(self._dfd)
        self._dfd = -1
        if self._fd != -1:
            os.close(self._fd)  # releases the flock
            self._fd = -1

    def close(self) -> None:
        """Sync and close (releases the lock)."""
        if self._fd == -1:
            return
        try:
            self.sync()
        finally:
            self._close_fds()
