"""Pool file locks: who owns a pool file, and taking it over from an owner that died.

Every pool file is `flock`ed (exclusive) by the process that owns it for as long as it
runs: the worker of each rank holds its L1 file, the store holds the L2 files. The kernel
drops the lock when the owner exits however it exits (kill -9 included), so an unlocked
pool file has no live owner: it is stale.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ._errors import PoolInUseError

_PROC_LOCKS = Path("/proc/locks")


def try_lock(fd: int) -> bool:
    """Take the exclusive lock of an open pool file; False if another owner holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holders(st: os.stat_result) -> list[int]:
    """Processes holding a flock on the file `st` describes (from /proc/locks; [] if unknown)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        text = _PROC_LOCKS.read_text()
    except OSError:
        return []
    pids = []
    for line in text.splitlines():
        fields = [f for f in line.split() if f != "->"]
        # "<n>: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> <start> <end>"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want:
            pids.append(int(fields[4]))
    return pids


def describe_process(pid: int) -> str:
    """`process 1234 (python -m vllm ...)`, or just the pid if its command line is unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"process {pid}"
    cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if len(cmdline) > 100:
        cmdline = cmdline[:97] + "..."
    return f"process {pid} ({cmdline})" if cmdline else f"process {pid}"


def owner_of(fd: int) -> str:
    """Who holds the lock of the open file `fd`, in words."""
    pids = holders(os.fstat(fd))
    if not pids:
        return "another process"
    return " and ".join(describe_process(p) for p in sorted(set(pids)))


def lock_or_raise(fd: int, path: Path, hint: str) -> None:
    """Take the lock of pool file `path` or raise PoolInUseError naming its owner and `hint`."""
    if not try_lock(fd):
        raise PoolInUseError(
            errno.EBUSY, f"{path} is in use by {owner_of(fd)}; nothing was changed. {hint}"
        )


def same_file(fd: int, path: Path) -> bool:
    """True if `path` still names the file open as `fd` (not removed or replaced)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev)
