"""Pool files: reserve space up front, write/read the superblock, map the file."""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path

from ._errors import InsufficientSpaceError

log = logging.getLogger("kvpool_mmap")


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def reserve(fd: int, size: int, path: Path, setting: str) -> None:
    """Allocate `size` bytes of real storage for `fd` (posix_fallocate).

    Raises InsufficientSpaceError naming the setting, the path and the shortfall, so that a
    full tmpfs or disk fails here at startup instead of as SIGBUS on first touch.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            free = _free_bytes(path.parent)
            raise InsufficientSpaceError(
                exc.errno,
                f"{setting}: cannot reserve {size} bytes for {path} "
                f"({free} bytes free on its filesystem); lower {setting} or free space",
            ) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # The filesystem cannot preallocate: make the file its full size (sparse) instead.
        log.warning("%s: fallocate unsupported on %s; space is not reserved", setting, path)
        os.ftruncate(fd, size)


def create_fresh(path: Path, size: int, first_page: bytes, setting: str) -> None:
    """Create `path` anew (reserved, superblock written) and rename it into place.

    A reader never sees a half-initialised file: it is built under a temporary name.
    An existing file at `path` is replaced; processes that still map it keep the old inode.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        reserve(fd, size, path, setting)
        os.pwrite(fd, first_page, 0)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)


def read_page0(fd: int, size: int) -> bytes:
    """The first `size` bytes of an open file."""
    return os.pread(fd, size, 0)


def map_file(fd: int, size: int, populate: bool = False) -> mmap.mmap:
    """Shared read/write mapping of the first `size` bytes of `fd`.

    populate=True pre-faults every page (MAP_POPULATE), so the data path never takes a
    page fault on first touch.
    """
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def close_map(mm: mmap.mmap) -> None:
    """Close a mapping; if views still point into it, leave it to the garbage collector."""
    try:
        mm.close()
    except BufferError:
        log.debug("mapping still has exported views; it is released when they are")


def write_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    """pwrite until every byte is written."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"short write at offset {offset + done}")
        done += n


def read_exact(fd: int, buf: memoryview, offset: int) -> None:
    """preadv until `buf` is full; EOF is an I/O error."""
    view = buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"short read at offset {offset + done}")
        done += n
