"""At its exit, the process that built the engine's config removes the engine's L1 files
once the engine processes vLLM killed have let go of them (real processes and locks)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

L1_NAME = "kvpool-m-0123456789ab-dp0-tp0.l1"

# Builds the config (registers the hook), leaves a process holding the L1 file as a worker
# does, and exits. "orphan": the holder is reparented (its engine was killed) and exits
# 1.5 s later; "child": the holder is a live child, which vLLM stops after this hook runs.
DRIVER = """
import fcntl, os, re, sys, time
from pathlib import Path
from vllm_marconi_offload.exit_cleanup import remove_l1_at_exit

folder, how = Path(sys.argv[1]), sys.argv[2]
path = folder / "kvpool-m-0123456789ab-dp0-tp0.l1"
path.write_bytes(b"\\0" * 4096)
ready_r, ready_w = os.pipe()
holder = os.fork()
if holder == 0:
    if how == "orphan" and os.fork():
        os._exit(0)
    for stream in (1, 2):  # the test reads the driver's output until it is closed
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream)
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(ready_w, b"x")
    time.sleep(1.5 if how == "orphan" else 30)
    os._exit(0)
if how == "orphan":
    os.waitpid(holder, 0)
os.read(ready_r, 1)
remove_l1_at_exit(folder, re.compile(r"kvpool-m-[0-9a-f]{12}-dp(?P<dp>\\d+)-tp\\d+\\.l[12]"))
print(holder, flush=True)
"""


def run_driver(folder: Path, how: str) -> tuple[float, int]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(folder), how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return time.monotonic() - started, int(done.stdout)


def test_exit_waits_for_a_killed_engines_worker_then_removes_the_l1_file(tmp_path: Path) -> None:
    seconds, _ = run_driver(tmp_path, "orphan")
    assert list(tmp_path.iterdir()) == []
    assert seconds >= 1.0  # it waited for the holder to let go


def test_exit_does_not_wait_for_its_own_live_workers(tmp_path: Path) -> None:
    """A live child still holding the file is stopped after the hook (by vLLM's own exit,
    and its worker removes the file): the hook neither waits for it nor removes the file."""
    seconds, holder = run_driver(tmp_path, "child")
    try:
        assert seconds < 8  # well under the 10 s wait for a killed engine
        assert [p.name for p in tmp_path.iterdir()] == [L1_NAME]
    finally:
        subprocess.run(["kill", str(holder)], check=False)
