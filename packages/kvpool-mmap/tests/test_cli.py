"""`kvpool list|check|clear`, run as a real command against real pool files, with a real
second process holding a pool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Holder, MakeConfig, block, key
from kvpool_mmap import StoreConfig, TieredStore, __version__


def kvpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool_mmap.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version() -> None:
    out = kvpool("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"kvpool {__version__}"


def stopped_and_running(
    make_config: MakeConfig, holders: list[Holder], blocks: int
) -> tuple[StoreConfig, Holder]:
    """A stopped 2-rank pool holding `blocks` blocks, and a 1-rank pool a live process holds."""
    stopped = make_config(engine_id="stopped", tp_size=2)
    with TieredStore(stopped) as store:
        store.put([key(i) for i in range(blocks)], [block(i, tp=2) for i in range(blocks)])
    running = Holder(make_config(engine_id="running"), "store")
    holders.append(running)
    return stopped, running


def test_list_shows_owner_fingerprint_size_and_blocks(
    make_config: MakeConfig, holders: list[Holder], tmp_path: Path
) -> None:
    _, running = stopped_and_running(make_config, holders, 3)

    out = kvpool("list", str(tmp_path / "l1"), str(tmp_path / "l2"))
    assert out.returncode == 0, out.stderr
    rows = {Path(line.split()[0]).name: line for line in out.stdout.splitlines()[1:]}
    assert sorted(rows) == [
        "kvpool-running-dp0-tp0.l1",
        "kvpool-running-dp0-tp0.l2",
        "kvpool-stopped-dp0-tp0.l2",
        "kvpool-stopped-dp0-tp1.l2",
    ]
    assert f"process {running.pid} (" in rows["kvpool-running-dp0-tp0.l1"]
    stopped_row = rows["kvpool-stopped-dp0-tp1.l2"].split()
    assert stopped_row[1:4] == ["l2", "none", "stopped"]
    assert stopped_row[-2:] == ["32", "3"]  # slots, blocks
    assert stopped_row[5] == rows["kvpool-stopped-dp0-tp0.l2"].split()[5]  # fingerprint
    running.stop()


def test_check_verifies_checksums_and_skips_a_running_pool(
    make_config: MakeConfig, holders: list[Holder], tmp_path: Path
) -> None:
    cfg, running = stopped_and_running(make_config, holders, 4)
    l2 = str(tmp_path / "l2")

    good = kvpool("check", l2)
    assert "kvpool-stopped-dp0-tp*.l2 (2 rank files): 4 blocks verified, 0 bad payloads" in (
        good.stdout
    )
    assert "kvpool-running-dp0-tp*.l2 (1 rank files): not checked: " in good.stdout
    assert f"process {running.pid}" in good.stdout
    assert good.returncode == 1  # the running pool could not be checked

    running.stop()
    payloads = cfg.l2_file(1).stat().st_size - 4096 * 32
    with open(cfg.l2_file(1), "r+b") as f:  # flip one byte in every payload of rank 1
        for slot in range(32):
            f.seek(payloads + slot * 4096 + 10)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    bad = kvpool("check", l2)
    assert bad.returncode == 1
    assert "0 blocks verified, 4 bad payloads" in bad.stdout
    assert kvpool("check", "--fix", l2).returncode == 0
    assert "0 blocks verified, 0 bad payloads" in kvpool("check", l2).stdout


def test_clear_removes_stale_files_and_refuses_a_running_pool(
    make_config: MakeConfig, holders: list[Holder], tmp_path: Path
) -> None:
    dead = Holder(make_config(engine_id="dead"), "store")
    holders.append(dead)
    dead.kill()
    layout_note = tmp_path / "l1" / "kvpool-dead-dp0-tp0.l1.layout"
    layout_note.write_text("x")
    leftover = tmp_path / "l1" / ".kvpool-dead-dp0-tp0.l1.999999999.tmp"
    leftover.touch()
    running = Holder(make_config(engine_id="running"), "store")
    holders.append(running)

    out = kvpool("clear", str(tmp_path / "l1"), str(tmp_path / "l2"))
    assert out.returncode == 1
    assert f"kept {tmp_path}/l1/kvpool-running-dp0-tp0.l1: " in out.stdout
    assert f"process {running.pid}" in out.stdout
    left = sorted(p.name for p in (tmp_path / "l1").iterdir())
    assert left == ["kvpool-running-dp0-tp0.l1"]  # dead L1, its note and the leftover gone
    assert (tmp_path / "l2" / "kvpool-dead-dp0-tp0.l2").exists()  # L2 only with --l2

    out = kvpool("clear", "--l2", str(tmp_path / "l2"))
    assert sorted(p.name for p in (tmp_path / "l2").iterdir()) == ["kvpool-running-dp0-tp0.l2"]
    running.stop()


@pytest.mark.parametrize("command", ["list", "check", "clear"])
def test_a_path_that_is_no_directory_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, why in ((tmp_path / "missing", "does not exist"), (afile, "is not a directory")):
        out = kvpool(command, str(path))
        assert out.returncode == 2
        assert out.stdout == ""
        assert out.stderr.splitlines() == [
            f"kvpool {command}: error: argument PATH: {path} {why}"
            + (" (give a pool directory)" if path == afile else "")
        ]
    assert afile.read_text() == "x"


def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, named in ((["clear", "--l3", str(tmp_path)], "--l3"), (["frob"], "'frob'")):
        out = kvpool(*args)
        assert out.returncode == 2
        lines = out.stderr.splitlines()
        assert len(lines) == 1
        assert lines[0].startswith("kvpool")
        assert named in lines[0]


def test_clear_on_an_empty_directory_says_so(tmp_path: Path) -> None:
    out = kvpool("clear", str(tmp_path))
    assert out.returncode == 0
    assert out.stdout == f"{tmp_path}: no pool files\n"
