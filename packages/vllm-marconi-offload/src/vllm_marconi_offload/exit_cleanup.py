"""Remove the engine's L1 files when the process the user started exits.

A worker removes its L1 file when vLLM shuts it down (`Worker.shutdown`), but vLLM's API
server stops its engine and worker processes with SIGKILL once its own shutdown begins
(Ctrl-C, or SIGINT/SIGTERM to its pid): the worker's cleanup then never runs. The process
the user started (the API server, or a script's `LLM`) outlives them, so at its exit it
waits until the killed processes of its session have released the engine's L1 files and
removes those files. Its own live descendants are not waited for: vLLM stops them after
this hook, and their workers then remove their files themselves.
"""

from __future__ import annotations

import atexit
import os
import re
import time
from pathlib import Path

from kvpool_mmap import KvPoolError, PoolInUseError, inspect_pool_file, pool_files, remove_if_stale

RELEASE_SECONDS = 10.0
"""How long the exit waits for killed processes still holding an L1 file to exit."""

_registered: set[tuple[str, str]] = set()


def remove_l1_at_exit(directory: Path, names: re.Pattern[str]) -> None:
    """At this process's exit, remove the L1 files in `directory` whose names match
    `names` once no other process of this session holds them (idempotent)."""
    key = (str(directory), names.pattern)
    if key in _registered:
        return
    _registered.add(key)
    atexit.register(_remove_released, directory, names, os.getpid())


def _remove_released(directory: Path, names: re.Pattern[str], pid: int) -> None:
    if os.getpid() != pid:
        return  # a forked child inherited the hook; the files are its parent's
    deadline = time.monotonic() + RELEASE_SECONDS
    while True:
        waiting = False
        for path in _l1_files(directory, names):
            try:
                remove_if_stale(path, "cpu_pool_path", "")
            except PoolInUseError:
                waiting = waiting or _held_in_session(path, pid)
            except (KvPoolError, OSError):
                continue
        if not waiting or time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _l1_files(directory: Path, names: re.Pattern[str]) -> list[Path]:
    try:
        paths = pool_files(directory)
    except OSError:
        return []
    return [p for p in paths if p.suffix == ".l1" and names.fullmatch(p.name)]


def _held_in_session(path: Path, pid: int) -> bool:
    """True if another process of this session holds `path`: one of the engine's that vLLM
    has killed and that has not exited yet (reparented by then, but still in the session;
    a descendant of `pid` is still attached, and is stopped after this hook)."""
    try:
        owners = inspect_pool_file(path).owners
    except (KvPoolError, OSError):
        return False
    session = os.getsid(0)
    return any(
        owner != pid and _session(owner) == session and not _descends_from(owner, pid)
        for owner in owners
    )


def _descends_from(child: int, pid: int) -> bool:
    """True if `pid` is `child`'s parent, grandparent, and so on (Linux /proc)."""
    while child > 1:
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            return False
        child = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        if child == pid:
            return True
    return False


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
