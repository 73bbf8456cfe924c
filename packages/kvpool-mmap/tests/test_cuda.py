"""L1 slots and CUDA: registration pins them, copies round-trip. Skipped without CUDA."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import MakeConfig
from kvpool_mmap import TierConfig, TieredStore, open_l1_rank
from kvpool_mmap._cuda import cuda_available

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs torch with a CUDA device")


@pytest.fixture
def shm() -> Iterator[Path]:
    """L1 lives on tmpfs in production; register memory from there."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


def test_register_and_round_trip(make_config: MakeConfig, shm: Path) -> None:
    import torch

    cfg = make_config(l1_slots=8, l2_slots=16, l1=TierConfig(shm, 8 * 4096))
    with TieredStore(cfg) as store:
        f = store.l1_files[0]
        assert f.register_cuda() is True
        assert f.register_cuda() is True  # idempotent
        view = f.torch_view()
        t = store.begin_store([b"k0"])
        slot = t.l1_slots[0]
        assert slot is not None
        gpu = torch.randint(0, 256, (cfg.stride,), dtype=torch.uint8, device="cuda")
        view[slot].copy_(gpu, non_blocking=True)  # D2H straight into the pinned slot
        torch.cuda.synchronize()
        store.commit_store(t)
        np.testing.assert_array_equal(f.array[slot], gpu.cpu().numpy())
        store.flush()
        f.unregister_cuda()


def test_worker_side_registration(make_config: MakeConfig, shm: Path) -> None:
    cfg = make_config(l1=TierConfig(shm, 4 * 4096))
    with open_l1_rank(cfg, 0, create=True) as f:
        assert f.register_cuda()
        f.unregister_cuda()
