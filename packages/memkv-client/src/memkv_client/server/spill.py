"""The optional spill directory: values evicted from memory are written here.

Files are named ``<counter>.mkv`` and never rewritten; a spilled value is served
straight from its file (``sendfile``). Spilled data does not survive a restart: the
directory's ``*.mkv`` files are removed when the server starts and stops.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SpillDir"]

SUFFIX = ".mkv"


class SpillDir:
    """Writes, opens and removes spill files, tracking bytes used. Thread-safe."""

    def __init__(self, directory: str | os.PathLike[str], capacity: int) -> None:
        self.directory = str(directory)
        self.capacity = capacity
        self.used = 0
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        self._clean()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _clean(self) -> None:
        for f in Path(self.directory).glob("*" + SUFFIX):
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

    def open(self, path: str) -> int:
        return os.open(path, os.O_RDONLY)

    def remove(self, path: str, length: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with self._lock:
            self.used -= length

    def close(self) -> None:
        self._clean()
