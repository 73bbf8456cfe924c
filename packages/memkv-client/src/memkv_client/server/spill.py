"""The optional spill directory: values evicted from memory are written here.

Files are named `<16 hex digits>.mkv` and never rewritten; a spilled value is served
straight from its file (`sendfile`). Spilled data does not survive a restart: those
files are removed when the server starts and stops.

The directory must be dedicated to MemKV: it is claimed with a marker file
(`MARKER`) when empty, and a non-empty directory without the marker is refused. Only
files named like spill files are ever removed, so nothing else in it is touched.

One server per directory: the server holds an exclusive `flock` on the marker for its
lifetime (the kernel drops it when the process dies, however it dies) and writes its
pid there; a second server is refused, naming the holder's pid, before it touches a
file.

Removing a file is accounted at once but unlinked by a background thread, so the store
may call `SpillDir.remove` while holding its index lock without doing I/O there.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import queue
import re
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SpillDir"]

SUFFIX = ".mkv"
MARKER = ".memkv-spill"
_SPILL_NAME = re.compile(r"[0-9a-f]{16}\.mkv")


class SpillDir:
    """Writes, opens and removes spill files, tracking bytes used. Thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], capacity: int) -> None:
        self.directory = str(directory)
        self.capacity = capacity
        self.used = 0
        self._lock_fd = self._claim()
        self._clean()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._doomed: queue.SimpleQueue[str | threading.Event | None] = queue.SimpleQueue()
        self._reaper = threading.Thread(target=self._reap, name="memkv-spill-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while (item := self._doomed.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(item)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every file removed so far is unlinked."""
        done = threading.Event()
        self._doomed.put(done)
        return done.wait(timeout)

    def _claim(self) -> int:
        """Create the directory or check that it is MemKV's, and lock it; the locked
        marker's descriptor. Raises ValueError if the directory is not MemKV's or another
        server holds it."""
        d = Path(self.directory)
        d.mkdir(parents=True, exist_ok=True)
        marker = d / MARKER
        if not marker.exists():
            others = sorted(f.name for f in d.iterdir())
            if others:
                shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
                raise ValueError(
                    f"--dir {self.directory}: not empty and not a MemKV spill directory (no "
                    f"{MARKER}; holds {shown}); give an empty or dedicated directory"
                )
        fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise ValueError(
                f"--dir {self.directory}: in use by another memkv server (pid {holder}); "
                "give each server a directory of its own"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"MemKV spill directory, held by pid {os.getpid()}: files named "
                     "<16 hex digits>.mkv here are deleted when the server starts and "
                     "stops.\n".encode())  # fmt: skip
        return fd

    def _clean(self) -> None:
        """Remove leftover spill files (by exact name only)."""
        for f in Path(self.directory).iterdir():
            if _SPILL_NAME.fullmatch(f.name) and f.is_file():
                f.unlink(missing_ok=True)

    def write(self, views: Sequence[memoryview], length: int) -> str:
        """Write a value to a new file; return its path. Raises OSError."""
        path = os.path.join(self.directory, f"{next(self._ids):016x}{SUFFIX}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for v in views:
                done = 0
                while done < len(v):
                    done += os.write(fd, v[done:])
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        with self._lock:
            self.used += length
        return path

    def open(self, path: str, length: int) -> int | None:
        """A read descriptor of a spill file holding `length` bytes; None if the file
        vanished or was cut short behind the server's back."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size < length:
            os.close(fd)
            return None
        return fd

    def present(self, path: str) -> bool:
        """Whether a spill file still exists."""
        return os.path.exists(path)

    def remove(self, path: str, length: int) -> None:
        """Forget a file now (its bytes no longer count); it is unlinked in the background.

        Open descriptors (readers being served) keep the data readable until closed.
        """
        with self._lock:
            self.used -= length
        self._doomed.put(path)

    def close(self) -> None:
        self._doomed.put(None)
        self._reaper.join(30)
        self._clean()
        os.close(self._lock_fd)  # releases the directory


def _holder_pid(fd: int) -> str:
    """The pid recorded in a locked marker, or "unknown" (an older server, or mid-write)."""
    text = os.pread(fd, 4096, 0).decode(errors="replace")
    found = re.search(r"held by pid (\d+)", text)
    return found.group(1) if found else "unknown"
