"""Pool files of dead owners give their space back before a new pool reserves its own, and a
pool that does not fit says which stale files hold the space; a refused pool leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import STRIDE, Holder, MakeConfig
from kvpool_mmap import (
    ConfigError,
    InsufficientSpaceError,
    TierConfig,
    TieredStore,
    check_l1_room,
    open_l1_rank,
)

L1_BYTES = 160 * STRIDE  # 640 KiB: two of them do not fit the 1 MiB tmpfs


def test_restart_under_another_engine_id_needs_one_l1(
    tiny_tmpfs: Path, make_config: MakeConfig, holders: list[Holder]
) -> None:
    l1 = TierConfig(tiny_tmpfs / "l1", L1_BYTES)
    killed = Holder(make_config(engine_id="before", l1=l1, l2_slots=None), "l1")
    holders.append(killed)
    killed.kill()  # its L1 file stays behind, holding 640 KiB of the tmpfs
    stale = make_config(engine_id="before", l1=l1, l2_slots=None).l1_file(0)
    assert stale.exists()

    with open_l1_rank(make_config(engine_id="after", l1=l1, l2_slots=None), 0) as new:
        assert new.path.exists()
    assert not stale.exists()


def test_no_space_names_the_stale_files_it_saw(tiny_tmpfs: Path, make_config: MakeConfig) -> None:
    # a stopped engine's L2 (kept: it holds blocks for its next start) fills the tmpfs
    stopped = make_config(
        engine_id="stopped",
        l1=TierConfig(tiny_tmpfs / "l1", 8 * STRIDE),
        l2=TierConfig(tiny_tmpfs / "l1", 120 * (STRIDE + 256)),
    )
    with TieredStore(stopped):
        pass
    cfg = make_config(engine_id="new", l1=TierConfig(tiny_tmpfs / "l1", L1_BYTES), l2_slots=None)
    with pytest.raises(InsufficientSpaceError) as excinfo:
        open_l1_rank(cfg, 0)
    message = str(excinfo.value)
    assert "l1.bytes_to_use" in message
    assert f"{stopped.l2_file(0)} (" in message
    assert "no running owner" in message
    assert f"kvpool clear --l2 {tiny_tmpfs / 'l1'}" in message


def test_room_counts_the_l1_files_of_dead_owners_and_nothing_live(
    tiny_tmpfs: Path, make_config: MakeConfig, holders: list[Holder]
) -> None:
    l1 = TierConfig(tiny_tmpfs / "l1", L1_BYTES)
    killed = Holder(make_config(engine_id="killed", l1=l1, l2_slots=None), "l1")
    holders.append(killed)
    killed.kill()
    check_l1_room(tiny_tmpfs / "l1", L1_BYTES, "cpu_bytes_to_use")  # its file is reclaimable
    live = Holder(make_config(engine_id="live", l1=l1, l2_slots=None), "l1")
    holders.append(live)  # the dead one's file went before the live one reserved its own
    with pytest.raises(InsufficientSpaceError) as excinfo:
        check_l1_room(tiny_tmpfs / "l1", L1_BYTES, "cpu_bytes_to_use")
    message = str(excinfo.value)
    assert message.startswith(f"[Errno 28] cpu_bytes_to_use: cannot reserve {L1_BYTES} bytes in ")
    assert "lower cpu_bytes_to_use or free space" in message
    check_l1_room(tiny_tmpfs / "not-yet" / "l1", 64 * STRIDE, "cpu_bytes_to_use")  # a parent's


def test_room_is_checked_on_the_nearest_existing_parent(tmp_path: Path) -> None:
    with pytest.raises(InsufficientSpaceError, match=r"l1\.bytes_to_use: cannot reserve"):
        check_l1_room(tmp_path / "a" / "b", 1 << 60, "l1.bytes_to_use")  # no disk has 1 EiB
    assert not (tmp_path / "a").exists()


def test_refused_l2_leaves_no_file(tmp_path: Path, make_config: MakeConfig) -> None:
    cfg = make_config(l2=TierConfig(tmp_path / "l2", 1 << 50))  # no disk here holds 1 PiB
    with pytest.raises(InsufficientSpaceError, match=r"l2\.bytes_to_use"):
        TieredStore(cfg)
    assert list((tmp_path / "l2").iterdir()) == []


@pytest.mark.parametrize("interval", [1e-9, 0.0005, 0])
def test_fsync_interval_has_a_floor(make_config: MakeConfig, interval: float) -> None:
    with pytest.raises(
        ConfigError, match=rf"fsync_interval_s must be a finite number >= 0.001, got {interval}"
    ):
        make_config(fsync_interval_s=interval)
