"""Space is reserved at startup: a too-small tmpfs fails with a clear error, not SIGBUS."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MakeConfig
from kvpool_mmap import InsufficientSpaceError, TierConfig, TieredStore, open_l1_rank


def test_l1_larger_than_tmpfs(tiny_tmpfs: Path, make_config: MakeConfig) -> None:
    cfg = make_config(l1=TierConfig(tiny_tmpfs / "l1", 4 << 20), l2_slots=None)
    with pytest.raises(InsufficientSpaceError, match=r"l1\.bytes_to_use.*bytes free"):
        open_l1_rank(cfg, 0, create=True)
    assert [p.name for p in (tiny_tmpfs / "l1").iterdir()] == []  # no half-made file left


def test_l2_larger_than_tmpfs(tiny_tmpfs: Path, make_config: MakeConfig) -> None:
    cfg = make_config(l2=TierConfig(tiny_tmpfs / "l2", 4 << 20))
    with pytest.raises(InsufficientSpaceError, match=r"l2\.bytes_to_use"):
        TieredStore(cfg)


def test_fits_in_tmpfs(tiny_tmpfs: Path, make_config: MakeConfig) -> None:
    cfg = make_config(l1=TierConfig(tiny_tmpfs / "l1", 512 << 10), l2_slots=None)
    with TieredStore(cfg) as s:
        assert s.put([b"a"], [[1] * cfg.stride]) == 1


def test_budget_beyond_any_disk(tmp_path: Path, make_config: MakeConfig) -> None:
    """Without mounting anything: a budget no filesystem here can hold (1 PiB)."""
    cfg = make_config(l2=TierConfig(tmp_path / "l2", 1 << 50))
    with pytest.raises(InsufficientSpaceError, match=r"l2\.bytes_to_use"):
        TieredStore(cfg)
    assert not cfg.l1_file(0).exists()  # the L1 file made before the failure was removed
