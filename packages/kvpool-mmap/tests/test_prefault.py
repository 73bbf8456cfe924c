"""A new L1 file is faulted in from several threads: every page allocated, none lost, and
a filesystem too small for it still fails at start-up with a clear error."""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeConfig
from kvpool_mmap import InsufficientSpaceError, TierConfig, _prefault, open_l1_rank

pytestmark = pytest.mark.skipif(
    not _prefault.supported(), reason="needs MADV_POPULATE_WRITE (Linux 5.14+)"
)


@pytest.fixture
def shm() -> Iterator[Path]:
    """L1 lives on tmpfs in production."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_populate_allocates_every_page_of_a_sparse_file(shm: Path) -> None:
    path = shm / "pool"
    size = 3 * _prefault.CHUNK_BYTES + 5 * mmap.PAGESIZE  # chunks split over threads, a tail
    with open(path, "w+b") as f:
        _prefault.claim(f.fileno(), size, path, "l1.bytes_to_use")
        assert allocated_bytes(path) == 0
        mm = mmap.mmap(f.fileno(), size)
        _prefault.populate(mm, mmap.PAGESIZE, size - mmap.PAGESIZE, path, "l1.bytes_to_use", 4)
        assert allocated_bytes(path) >= size - mmap.PAGESIZE
        data = np.frombuffer(mm, dtype=np.uint8)
        assert not data.any()  # populating writes nothing
        del data
        mm.close()


def test_a_new_l1_file_is_allocated_whole_and_keeps_what_is_written(
    make_config: MakeConfig, shm: Path
) -> None:
    cfg = make_config(l1_slots=64, l1=TierConfig(shm, 64 * 4096))
    with open_l1_rank(cfg, 0, create=True) as f:
        assert allocated_bytes(f.path) >= f.array.nbytes
        f.array[:] = (np.arange(f.array.size) % 251).astype(np.uint8).reshape(f.array.shape)
        again = np.fromfile(f.path, dtype=np.uint8, offset=f.data_offset, count=f.array.size)
        np.testing.assert_array_equal(again.reshape(f.array.shape), f.array)


def test_a_filesystem_that_fills_before_the_populate_fails_it_clearly(
    tiny_tmpfs: Path, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process takes the space between the check and the faulting: the populate
    fails with the setting's name, never a SIGBUS later, and no file is left."""
    monkeypatch.setattr(_prefault, "free_bytes", lambda path: 1 << 40)
    cfg = make_config(l1=TierConfig(tiny_tmpfs / "l1", 4 << 20), l2_slots=None)
    with pytest.raises(InsufficientSpaceError, match=r"l1\.bytes_to_use.*bytes free"):
        open_l1_rank(cfg, 0, create=True)
    assert [p.name for p in (tiny_tmpfs / "l1").iterdir()] == []
