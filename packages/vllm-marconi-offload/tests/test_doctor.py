"""`python -m vllm_marconi_offload doctor` on real hosts: small tmpfs and ramfs mounts,
/dev/shm, pool files held by a live process or left by a killed one, and the command as
a user runs it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from host_fixtures import Mount, install_vllm_metadata  # tools/, on the path (conftest.py)
from vllm_kv_identity.doctor import Check, Status
from vllm_kv_identity.host_checks import filesystem_type, free_bytes
from vllm_marconi_offload.doctor import doctor_checks
from vllm_marconi_offload.pool import ANONYMOUS_L1_PREFIX, ANONYMOUS_L1_ROOT

# A standalone kvpool-mmap store owning its L1 (and L2) pool files until it exits.
HOLD_POOL = """
import sys, time
from kvpool_mmap import HEADER_BYTES, StoreConfig, TierConfig, TieredStore
l1, l2, name = sys.argv[1:4]
store = TieredStore(StoreConfig(
    stride=4096, engine_id=name, fingerprint=b"doctor-test",
    l1=TierConfig(l1, 8 * 4096), l2=TierConfig(l2, 16 * (4096 + HEADER_BYTES)), tp_size=1,
))
print("READY", flush=True)
time.sleep(600)
"""


def _find(checks: list[Check], start: str) -> Check:
    found = [c for c in checks if c.finding.startswith(start)]
    assert len(found) == 1, "\n".join(c.finding for c in checks)
    return found[0]


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A directory name under /dev/shm that nothing has created."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    path = Path("/dev/shm") / f"doctor-test-{uuid.uuid4().hex[:8]}"
    yield path
    if path.exists():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


def _hold_pool(l1: Path, l2: Path) -> subprocess.Popen[str]:
    """A live process owning pool `held`: its L1 file in `l1`, its L2 file in `l2`."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_POOL, str(l1), str(l2), "held"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"
    return proc


@pytest.fixture
def pool_holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """`_hold_pool` in tmp/l1 and tmp/l2."""
    l1, l2 = tmp_path / "l1", tmp_path / "l2"
    proc = _hold_pool(l1, l2)
    yield proc, l1, l2
    proc.kill()
    proc.wait()


def test_l1_larger_than_a_small_tmpfs_fails(mount: Mount) -> None:
    small = mount("tmpfs", "size=1m")
    checks = doctor_checks({"cpu_pool_path": str(small / "l1"), "cpu_bytes_to_use": "4MiB"})
    check = _find(checks, "cpu_bytes_to_use: cannot reserve 4194304 bytes")
    assert check.status is Status.FAIL
    assert check.fix == "lower cpu_bytes_to_use or free space"  # not /dev/shm: no Docker hint


def test_l1_larger_than_dev_shm_names_docker_shm_size(shm_dir: Path) -> None:
    need = int(free_bytes(Path("/dev/shm")) or 0) + (3 << 30)
    checks = doctor_checks({"cpu_pool_path": str(shm_dir), "cpu_bytes_to_use": need})
    check = _find(checks, f"cpu_bytes_to_use: cannot reserve {need} bytes in {shm_dir}")
    assert check.status is Status.FAIL
    size = -(-need // (1 << 30)) + 1
    assert check.fix == (
        f"lower cpu_bytes_to_use or grow /dev/shm (mount -o remount,size={size}G /dev/shm; "
        f"in Docker: docker run --shm-size={size}g)"
    )
    assert not shm_dir.exists()  # the doctor creates nothing


def test_l1_that_fits_in_dev_shm(shm_dir: Path) -> None:
    checks = doctor_checks({"cpu_pool_path": str(shm_dir), "cpu_bytes_to_use": "1MiB"})
    check = _find(checks, "cpu_bytes_to_use: 1 MiB fit in")
    assert check.status is Status.OK
    assert "(tmpfs," in check.finding


def test_l1_on_disk_warns(tmp_path: Path) -> None:
    if filesystem_type(tmp_path) == "tmpfs":
        pytest.skip(f"{tmp_path} is a tmpfs")
    checks = doctor_checks({"cpu_pool_path": str(tmp_path), "cpu_bytes_to_use": "1MiB"})
    assert _find(checks, f"cpu_pool_path: {tmp_path} is on ").status is Status.WARN


def test_l2_space_and_o_direct(mount: Mount) -> None:
    small, ramfs = mount("tmpfs", "size=1m"), mount("ramfs")
    on_small: dict[str, Any] = {"l2_pool_path": str(small / "l2"), "l2_bytes_to_use": "8MiB"}
    assert _find(doctor_checks(on_small), "l2_bytes_to_use: 8 MiB do not fit").status is Status.FAIL
    required = {"l2_pool_path": str(ramfs), "l2_bytes_to_use": "1MiB", "direct_io": "on"}
    o_direct = f"l2_pool_path: {ramfs} (ramfs) refuses O_DIRECT"
    assert _find(doctor_checks(required), o_direct).status is Status.FAIL
    fallback = {**required, "direct_io": "auto"}
    assert _find(doctor_checks(fallback), o_direct).status is Status.WARN
    assert _find(doctor_checks(fallback), "l2_bytes_to_use: 1 MiB fit").status is Status.OK
    without = {**required, "direct_io": "off"}
    assert not [c for c in doctor_checks(without) if "O_DIRECT" in c.finding]


def test_pool_in_use_by_a_live_process(
    pool_holder: tuple[subprocess.Popen[str], Path, Path],
) -> None:
    proc, l1, l2 = pool_holder
    config = {"cpu_pool_path": str(l1), "l2_pool_path": str(l2), "l2_bytes_to_use": "1MiB"}
    same = doctor_checks({**config, "pool_name": "held"})
    in_use = [c for c in same if "in use by" in c.finding]
    assert [c.status for c in in_use] == [Status.FAIL, Status.FAIL]  # its L1 and its L2
    assert f"in use by process {proc.pid} (" in in_use[0].finding
    assert in_use[0].fix == "stop that server, or give this one its own pool_name"
    other = doctor_checks({**config, "pool_name": "another"})
    assert [c.status for c in other if "in use by" in c.finding] == [Status.WARN, Status.WARN]


def test_pool_left_by_a_killed_process(
    pool_holder: tuple[subprocess.Popen[str], Path, Path],
) -> None:
    proc, l1, l2 = pool_holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checks = doctor_checks(
        {
            "cpu_pool_path": str(l1),
            "l2_pool_path": str(l2),
            "l2_bytes_to_use": "1MiB",
            "pool_name": "held",
        }
    )
    stale_l1 = _find(checks, f"cpu_pool_path: {l1}/kvpool-held-dp0-tp0.l1 (")
    assert stale_l1.status is Status.WARN
    assert "was left by a stopped engine: it holds RAM" in stale_l1.finding
    assert stale_l1.fix == f"`kvpool clear {l1}` removes it now"
    stale_l2 = _find(checks, f"l2_pool_path: {l2}/kvpool-held-dp0-tp0.l2 has no running owner")
    assert stale_l2.status is Status.OK


def test_private_l1_left_in_dev_shm_by_a_killed_process(tmp_path: Path) -> None:
    if not Path(ANONYMOUS_L1_ROOT).is_dir():
        pytest.skip(f"no {ANONYMOUS_L1_ROOT}")
    private = Path(ANONYMOUS_L1_ROOT) / f"{ANONYMOUS_L1_PREFIX}doctor-test-{uuid.uuid4().hex[:8]}"
    try:
        proc = _hold_pool(private, tmp_path / "l2")
        proc.kill()
        proc.wait()
        left = _find(
            doctor_checks({}), f"cpu_pool_path (not set): {private}/kvpool-held-dp0-tp0.l1"
        )
        assert left.status is Status.WARN
        assert left.fix == f"`kvpool clear {private}` removes it now"
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_bad_value_is_the_one_configuration_failure() -> None:
    checks = doctor_checks({"cpu_bytes_to_use": "lots"})
    assert checks[-1].status is Status.FAIL
    assert checks[-1].finding.startswith("configuration: ")
    assert "cpu_bytes_to_use" in checks[-1].finding


def _doctor(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, with vLLM 0.32.0 installed and PYTHONHASHSEED=0."""
    site = install_vllm_metadata(tmp_path / "site", "0.32.0")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    env.pop("MARCONI_OFFLOAD_CONFIG", None)
    cmd = [sys.executable, "-m", "vllm_marconi_offload", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_command_with_a_config_file(tmp_path: Path, shm_dir: Path) -> None:
    config = tmp_path / "offload.yaml"
    l2 = tmp_path / "l2"
    config.write_text(f"cpu_pool_path: {shm_dir}\ncpu_bytes_to_use: 1MiB\n"
                      f"l2_pool_path: {l2}\nl2_bytes_to_use: 1MiB\n")  # fmt: skip
    done = _doctor(tmp_path, "--config", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "vllm-marconi-offload doctor"
    assert (
        lines[1]
        == "✔ vLLM 0.32.0 (vllm) is in vllm-marconi-offload's supported range >=0.26.0,<0.34"
    )
    assert lines[2].startswith(f"✔ configuration (with {config}): valid; L1 1 MiB in {shm_dir}")
    assert "✔ PYTHONHASHSEED=0: block hashes are the same in every process" in lines
    assert lines[-1].endswith("0 failure(s): a server can start")

    too_big = int(free_bytes(Path("/dev/shm")) or 0) + (1 << 30)
    done = _doctor(
        tmp_path, "--config", str(config), "--extra-config", f'{{"cpu_bytes_to_use": {too_big}}}'
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"✖ cpu_bytes_to_use: cannot reserve {too_big} bytes in {shm_dir}" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("a server would fail to start")


def test_command_refuses_json_that_is_no_object(tmp_path: Path) -> None:
    done = _doctor(tmp_path, "--kv-transfer-config", "[1, 2]")
    assert done.returncode == 2
    assert "--kv-transfer-config: must be a JSON object, got list" in done.stderr
