"""Pool files in a directory: what they are, who owns them, and removing stale ones.

A pool file is named `kvpool-<engine_id>-dp<d>-tp<t>.l1` or `.l2` (see StoreConfig) and is
locked by its owner while it runs (see _lock). Files named after a pool file
(`<name>.<suffix>`, e.g. a connector's `.layout` note) belong to it and go with it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from ._codec import L1_MAGIC, L2_MAGIC, Superblock, decode_table
from ._config import HEADER_BYTES, PAGE
from ._errors import InsufficientSpaceError, KvPoolError, LayoutMismatchError, PoolInUseError
from ._lock import describe_process, holders, lock_or_raise, same_file
from ._slab import free_bytes, open_pool_file

log = logging.getLogger("kvpool_mmap")

POOL_FILE = re.compile(r"^kvpool-(?P<engine>.+)-dp(?P<dp>\d+)-tp(?P<tp>\d+)\.(?P<tier>l[12])$")
LEFTOVER = re.compile(r"^\.kvpool-.+\.l[12]\.(?P<pid>\d+)\.tmp$")
"""Temporary L1 files (`.<name>.<pid>.tmp`) that earlier versions left when killed."""


@dataclass(frozen=True)
class PoolFile:
    """What one pool file holds, read without locking it."""

    path: Path
    tier: str
    """"l1" or "l2"."""
    size: int
    owners: tuple[int, ...]
    """Processes holding its lock; empty if no running engine owns it (an L1 file is then
    stale; an L2 file waits for its engine's next start)."""
    superblock: Superblock | None
    problem: str
    """Why the superblock could not be read (empty if it was)."""
    blocks: int | None
    """L2: slots holding a block with a valid header; None for L1 (no headers)."""

    @property
    def owner(self) -> str:
        """The owning processes in words, or "none"."""
        if not self.owners:
            return "none"
        return " and ".join(describe_process(p) for p in self.owners)


def pool_files(directory: Path) -> list[Path]:
    """Regular files in `directory` named like pool files, sorted."""
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if POOL_FILE.match(entry.name) and entry.is_file(follow_symlinks=False):
            out.append(Path(entry.path))
    return out


def inspect_pool_file(path: Path) -> PoolFile:
    """Describe a pool file without taking its lock (a running engine is not disturbed)."""
    match = POOL_FILE.match(path.name)
    tier = match["tier"] if match else "?"
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LayoutMismatchError(f"{path} is not a regular file")
        owners = tuple(sorted(set(holders(st))))
        superblock, problem, blocks = None, "", None
        try:
            superblock = Superblock.decode(
                os.pread(fd, PAGE, 0), L1_MAGIC if tier == "l1" else L2_MAGIC
            )
        except LayoutMismatchError as exc:
            problem = str(exc)
        if superblock is not None and tier == "l2":
            n = superblock.num_slots * HEADER_BYTES
            raw = os.pread(fd, n, superblock.header_offset)
            if len(raw) == n:
                table = np.frombuffer(raw, dtype=np.uint8).reshape(-1, HEADER_BYTES)
                blocks = len(decode_table(table)[0])
            else:
                problem = f"header table is cut short ({len(raw)} of {n} bytes)"
        return PoolFile(path, tier, st.st_size, owners, superblock, problem, blocks)
    finally:
        os.close(fd)


def remove_if_stale(path: Path, setting: str, hint: str) -> None:
    """Remove a pool file and the files named after it, unless a running engine holds
    it: then PoolInUseError names the owner and `hint`, and nothing is removed.
    A path that is no regular file is a ConfigError naming `setting`."""
    fd = open_pool_file(path, setting, create=False)
    try:
        lock_or_raise(fd, path, hint)
        if same_file(fd, path):
            log.info("kvpool: removing %s, left by an engine that has exited", path)
            for companion in path.parent.glob(glob_escape(path.name) + ".*"):
                with contextlib.suppress(FileNotFoundError):
                    companion.unlink()
            os.unlink(path)
    finally:
        os.close(fd)


def glob_escape(name: str) -> str:
    """`name` with glob metacharacters quoted."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove temporary files that earlier versions left when killed while creating
    an L1 file, once the process named in them has exited."""
    removed = []
    for entry in os.scandir(directory):
        m = LEFTOVER.match(entry.name)
        if m and entry.is_file(follow_symlinks=False) and not psutil.pid_exists(int(m["pid"])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def remove_stale_l1(directory: Path) -> list[Path]:
    """Remove L1 files in `directory` whose owner is gone, and leftover temporary files.

    L1 files are scratch memory that only their running owner uses; one without a live
    owner (an engine killed, or restarted under another model or layout) only holds
    tmpfs memory. L2 files are never touched here. Never raises: a file that cannot be
    examined or removed is left alone.
    """
    try:
        removed = remove_leftovers(directory)
    except OSError as exc:
        log.debug("kvpool: cannot scan %s: %s", directory, exc)
        return []
    for path in pool_files(directory):
        if not path.name.endswith(".l1"):
            continue
        try:
            remove_if_stale(path, "l1.path", "")
        except (KvPoolError, OSError) as exc:  # in use (the usual case), or not ours to remove
            if not isinstance(exc, PoolInUseError | FileNotFoundError):
                log.debug("kvpool: left %s alone: %s", path, exc)
            continue
        removed.append(path)
    return removed


def stale_pool_files(directory: Path) -> list[PoolFile]:
    """Pool files in `directory` that no running process holds (never raises)."""
    stale = []
    try:
        paths = pool_files(directory)
    except OSError:
        return []
    for path in paths:
        try:
            info = inspect_pool_file(path)
        except (KvPoolError, OSError):
            continue
        if not info.owners:
            stale.append(info)
    return stale


@contextlib.contextmanager
def naming_stale_files(directory: Path) -> Iterator[None]:
    """Re-raise InsufficientSpaceError naming the stale pool files in `directory` that
    hold part of the space, and the command that removes them."""
    try:
        yield
    except InsufficientSpaceError as exc:
        stale = stale_pool_files(directory)
        if not stale:
            raise
        listed = ", ".join(f"{f.path} ({f.size} bytes)" for f in stale)
        flag = "--l2 " if any(f.tier == "l2" for f in stale) else ""
        raise InsufficientSpaceError(
            exc.errno,
            f"{exc.strerror}; stale pool files there (no running owner): {listed}; "
            f"`kvpool clear {flag}{directory}` removes them"
            + (" (an L2 file's blocks are lost)" if flag else ""),
        ) from exc


def check_l1_room(directory: Path, size: int, setting: str, *, also: Iterable[Path] = ()) -> None:
    """Raise InsufficientSpaceError (one line naming `setting`) unless `size` bytes of L1
    files fit in `directory` before any is created.

    The room is the free space of its filesystem (of its nearest existing parent, if it
    does not exist yet) plus the L1 files there, and in the folders `also`, that no running
    process holds: an L1 file's creation removes those first (`remove_stale_l1`).
    """
    existing = directory
    while not existing.is_dir() and existing != existing.parent:
        existing = existing.parent
    try:
        free = free_bytes(existing)
    except OSError:
        return  # cannot tell: the reservation itself will say
    stale = [f for folder in (directory, *also) for f in stale_pool_files(folder) if f.tier == "l1"]
    room = free + sum(f.size for f in stale)
    if size > room:
        raise InsufficientSpaceError(
            errno.ENOSPC,
            f"{setting}: cannot reserve {size} bytes in {directory} ({room} bytes free on its "
            f"filesystem, counting L1 files of stopped engines); lower {setting} or free space",
        )
