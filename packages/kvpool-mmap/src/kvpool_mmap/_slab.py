"""Pool files: reserve space up front, write/read the superblock, map the file."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
from pathlib import Path

from ._errors import ConfigError, InsufficientSpaceError

log = logging.getLogger("kvpool_mmap")


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer can still allocate on `path`'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def no_space_error(size: int, path: Path, setting: str) -> InsufficientSpaceError:
    """The one-line error of a pool file that does not fit, naming `setting`."""
    return InsufficientSpaceError(
        errno.ENOSPC,
        f"{setting}: cannot reserve {size} bytes for {path} "
        f"({free_bytes(path.parent)} bytes free on its filesystem); lower {setting} or free space",
    )


def reserve(fd: int, size: int, path: Path, setting: str) -> None:
    """Allocate `size` bytes of real storage for `fd` (posix_fallocate).

    Raises InsufficientSpaceError naming the setting, the path and the shortfall, so that a
    full tmpfs or disk fails here at startup instead of as SIGBUS on first touch.
    """
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise no_space_error(size, path, setting) from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # The filesystem cannot preallocate: make the file its full size (sparse) instead.
        log.warning("%s: fallocate unsupported on %s; space is not reserved", setting, path)
        os.ftruncate(fd, size)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_pool_file(path: Path, setting: str, *, create: bool) -> int:
    """Open a pool file read/write, never through a symlink and only if it is a regular
    file; ConfigError naming `setting` and the path otherwise (a FIFO, /dev/null, a file
    that cannot be written, e.g. immutable)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            what = _kind(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                what += f" to {os.readlink(path)}"
            raise ConfigError(
                f"{setting}: {path} is {what}, not a pool file; "
                f"remove it or choose another {setting}"
            )
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"{setting}: cannot open {path} for reading and writing: {exc.strerror}"
        ) from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(f"{setting}: {path} is {_kind(mode)}, not a pool file")
    os.set_blocking(fd, True)
    return fd


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
