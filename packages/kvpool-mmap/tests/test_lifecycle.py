"""Pool files across restarts and between engines, with real processes and real kill -9.

L1 is scratch memory: removed by its owner on close, removed at the next start if the
owner died; the budget is never needed twice. Every pool file is locked by its running
owner, so a second engine under the same name changes nothing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from conftest import Holder, MakeConfig, block, key
from kvpool_mmap import (
    ConfigError,
    LayoutMismatchError,
    PoolInUseError,
    TierConfig,
    TieredStore,
    check_l2,
    open_l1_rank,
)
from kvpool_mmap._l2file import L2RankFile


def _digest(directory: Path) -> dict[str, tuple[int, str]]:
    """Inode and content hash of every file in `directory`."""
    return {
        p.name: (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(directory.iterdir())
    }


# --- item 1: L1 across restarts ---------------------------------------------------------


def test_close_removes_the_l1_file_its_creator_made(make_config: MakeConfig) -> None:
    cfg = make_config(l2_slots=None)
    worker = open_l1_rank(cfg, 0, create=True)
    store = TieredStore(cfg, create_l1=False)
    store.close()
    assert cfg.l1_file(0).exists()  # an attached store never removes it
    worker.close()
    assert not cfg.l1_file(0).exists()


def test_restart_after_kill_needs_the_l1_budget_once(
    tiny_tmpfs: Path, make_config: MakeConfig, holders: list[Holder]
) -> None:
    # 640 KiB of a 1 MiB tmpfs: two copies never fit, so a restart must free the old file
    # (its owner was killed) before reserving the new one.
    cfg = make_config(l1=TierConfig(tiny_tmpfs / "l1", 160 * 4096), l2_slots=None)
    for _ in range(3):
        h = Holder(cfg, "l1")
        holders.append(h)
        h.kill()
        assert cfg.l1_file(0).exists()  # kill -9 leaves the file behind
    with open_l1_rank(cfg, 0, create=True) as f:
        assert f.num_slots == 160
    assert list((tiny_tmpfs / "l1").iterdir()) == []


def test_stale_l1_files_of_dead_owners_are_reclaimed_at_start(
    make_config: MakeConfig, holders: list[Holder]
) -> None:
    old = make_config(engine_id="old-model", l2_slots=None)
    live = make_config(engine_id="other-engine", l2_slots=None)
    dead = Holder(old, "l1")
    holders.append(dead)
    dead.kill()
    companion = old.l1_file(0).with_name(old.l1_file(0).name + ".layout")
    companion.write_text("a note of the dead engine")
    running = Holder(live, "l1")
    holders.append(running)
    leftover_dead = old.l1_file(0).with_name(".kvpool-x-dp0-tp0.l1.999999999.tmp")
    leftover_live = old.l1_file(0).with_name(f".kvpool-y-dp0-tp0.l1.{running.pid}.tmp")
    leftover_dead.touch()
    leftover_live.touch()

    with open_l1_rank(make_config(engine_id="new", l2_slots=None), 0, create=True):
        names = sorted(p.name for p in old.l1_file(0).parent.iterdir())
    assert names == [
        leftover_live.name,
        "kvpool-new-dp0-tp0.l1",
        "kvpool-other-engine-dp0-tp0.l1",
    ]
    running.stop()


# --- item 2: a second engine under the same name changes nothing -----------------------


@pytest.mark.parametrize("with_l2", [False, True], ids=["l1-only", "l1-and-l2"])
def test_second_engine_with_the_same_name_changes_nothing(
    make_config: MakeConfig, holders: list[Holder], tmp_path: Path, with_l2: bool
) -> None:
    cfg = make_config(l2_slots=32 if with_l2 else None)
    first = Holder(cfg, "store")
    holders.append(first)
    before = {d: _digest(tmp_path / d) for d in ("l1", "l2") if (tmp_path / d).exists()}

    with pytest.raises(PoolInUseError) as err:
        open_l1_rank(cfg, 0, create=True)  # the second engine's worker
    with pytest.raises(PoolInUseError):
        TieredStore(cfg)  # a second standalone store

    message = str(err.value)
    assert str(cfg.l1_file(0)) in message
    assert f"process {first.pid} (" in message  # who holds it
    assert "engine_id" in message
    assert "nothing was changed" in message
    assert {d: _digest(tmp_path / d) for d in before} == before
    first.stop()


def test_second_engine_on_another_l1_path_is_refused_by_the_l2_lock(
    make_config: MakeConfig, holders: list[Holder], tmp_path: Path
) -> None:
    cfg = make_config()
    first = Holder(cfg, "store")
    holders.append(first)
    before = _digest(tmp_path / "l2")
    other_l1 = make_config(l1=TierConfig(tmp_path / "l1b", cfg.l1.bytes_to_use))
    with pytest.raises(PoolInUseError, match=rf"\.l2 is in use by process {first.pid} "):
        TieredStore(other_l1)
    assert _digest(tmp_path / "l2") == before
    assert list((tmp_path / "l1b").iterdir()) == []  # its own L1 removed again
    first.stop()


def test_pool_of_a_killed_engine_is_taken_over(
    make_config: MakeConfig, holders: list[Holder]
) -> None:
    cfg = make_config()
    dead = Holder(cfg, "store")
    holders.append(dead)
    dead.kill()
    with TieredStore(cfg) as store:
        assert (store.get([key(1)])[0] == block(1)).all()  # written through before the kill


# --- item 3: check_l2 releases what it opened ------------------------------------------


def test_check_l2_releases_earlier_ranks_when_a_later_rank_is_bad(
    make_config: MakeConfig,
) -> None:
    cfg = make_config(tp_size=2)
    with TieredStore(cfg) as store:
        store.put([key(1)], block(1, tp=2))
    with open(cfg.l2_file(1), "r+b") as f:
        f.write(b"garbage!")  # rank 1's superblock
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(LayoutMismatchError):
        check_l2(cfg)
    assert len(os.listdir("/proc/self/fd")) == fds_before
    L2RankFile(cfg, 0, wipe=False).close()  # rank 0 is not left locked


# --- item 5: hostile L2 paths -----------------------------------------------------------


def _symlink_to_dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("make_hostile", "what"),
    [(_symlink_to_dev_null, "symbolic link to /dev/null"), (_fifo, "FIFO")],
    ids=["symlink-to-dev-null", "fifo"],
)
def test_l2_file_that_is_no_regular_file(
    make_config: MakeConfig, make_hostile: object, what: str
) -> None:
    cfg = make_config()
    assert cfg.l2 is not None
    Path(cfg.l2.path).mkdir()
    make_hostile(cfg.l2_file(0))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=rf"l2\.path: {cfg.l2_file(0)} is a {what}"):
        TieredStore(cfg)


def test_immutable_l2_file(make_config: MakeConfig) -> None:
    cfg = make_config()
    with TieredStore(cfg):
        pass
    made = subprocess.run(["chattr", "+i", str(cfg.l2_file(0))], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not possible here: {made.stderr.decode().strip()}")
    try:
        with pytest.raises(ConfigError, match=rf"l2\.path: cannot open {cfg.l2_file(0)}"):
            TieredStore(cfg)
    finally:
        subprocess.run(["chattr", "-i", str(cfg.l2_file(0))], check=False)
