"""Fault a new pool mapping in from several threads at once.

Faulting in tens of GiB of fresh tmpfs pages from one thread (posix_fallocate, then
MAP_POPULATE) costs seconds at start-up, most of it the first touch of each page. Here the
file only gets its size (`claim`), and `populate` splits the mapping between threads,
each asking the kernel to fault its share in writable (`MADV_POPULATE_WRITE`, Linux 5.14+),
which allocates the file's pages as a write would. Space is still checked before anything
is faulted, and a filesystem that fills up meanwhile fails the populate with
`InsufficientSpaceError`, never with SIGBUS on a later touch.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ._slab import free_bytes, no_space_error

MADV_POPULATE_WRITE = 23  # <linux/mman.h>
CHUNK_BYTES = 64 << 20
"""Bytes one call populates: small enough to spread a pool evenly over the threads."""
MAX_THREADS = 8


@functools.cache
def _madvise() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL during the call
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def supported() -> bool:
    """True if this kernel populates mappings on request (MADV_POPULATE_WRITE)."""
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        return _populate_range(_address(probe), mmap.PAGESIZE) == 0
    except OSError:
        return False
    finally:
        probe.close()


def default_threads() -> int:
    """Threads that fault a pool in: the usable cores, at most `MAX_THREADS`."""
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def claim(fd: int, size: int, path: Path, setting: str) -> None:
    """Give the new pool file `size` bytes without allocating them (`populate` does),
    after checking that its filesystem has them free (InsufficientSpaceError naming
    `setting` and the shortfall otherwise)."""
    if free_bytes(path.parent) < size:
        raise no_space_error(size, path, setting)
    os.ftruncate(fd, size)


def populate(
    mm: mmap.mmap, offset: int, nbytes: int, path: Path, setting: str, threads: int = 0
) -> None:
    """Fault `nbytes` of the shared mapping `mm` from `offset` (page-aligned) in, writable,
    on `threads` threads (default `default_threads()`). InsufficientSpaceError naming
    `setting` if the file's filesystem cannot back every page."""
    if offset % mmap.PAGESIZE:
        raise ValueError(f"offset {offset} is not a multiple of the page size")
    base = _address(mm) + offset
    starts = range(0, nbytes, CHUNK_BYTES)
    with ThreadPoolExecutor(threads or default_threads()) as pool:
        codes = pool.map(lambda s: _populate_range(base + s, min(CHUNK_BYTES, nbytes - s)), starts)
        failed = next((code for code in codes if code), 0)
    if failed in (errno.EFAULT, errno.ENOMEM, errno.ENOSPC):
        raise no_space_error(nbytes, path, setting)
    if failed:
        raise OSError(failed, f"{setting}: cannot fault in {path}: {os.strerror(failed)}")


def _populate_range(address: int, nbytes: int) -> int:
    """0, or the errno of madvise(MADV_POPULATE_WRITE) over the range."""
    if _madvise()(address, nbytes, MADV_POPULATE_WRITE) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


def _address(mm: mmap.mmap) -> int:
    """The mapping's first byte (the buffer export is released before returning)."""
    view = (ctypes.c_char * 1).from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view
