"""L1 rank files: create in the worker, attach from the store, zero-copy views."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MakeConfig
from kvpool_mmap import LayoutMismatchError, TieredStore, open_l1_rank
from kvpool_mmap._cuda import cuda_available


def test_worker_creates_store_attaches(make_config: MakeConfig) -> None:
    cfg = make_config(tp_size=2, l1_slots=4)
    workers = [open_l1_rank(cfg, r, create=True) for r in range(2)]
    store = TieredStore(cfg, create_l1=False)
    try:
        t = store.begin_store([b"a"])
        slot = t.l1_slots[0]
        assert slot is not None
        for r, w in enumerate(workers):  # the "worker" writes, through its own mapping
            w.array[slot] = r + 1
        store.commit_store(t)
        load = store.begin_load([b"a"])
        assert load.l1_slots == [slot]
        for r, f in enumerate(store.l1_files):
            assert (f.array[slot] == r + 1).all()
        store.end_load(load)
    finally:
        store.close()
        for w in workers:
            w.close(unlink=True)


def test_attach_without_worker_file_is_a_clear_error(make_config: MakeConfig) -> None:
    cfg = make_config()
    with pytest.raises(LayoutMismatchError, match=r"does not exist.*open_l1_rank"):
        TieredStore(cfg, create_l1=False)


def test_attach_to_other_geometry_is_refused(make_config: MakeConfig) -> None:
    w = open_l1_rank(make_config(stride=8192, l1_slots=4), 0, create=True)
    try:
        with pytest.raises(LayoutMismatchError, match="stride"):
            open_l1_rank(make_config(stride=4096, l1_slots=8), 0, create=False)
        with pytest.raises(LayoutMismatchError, match="fingerprint"):
            open_l1_rank(make_config(stride=8192, l1_slots=4, fingerprint=b"x"), 0, create=False)
    finally:
        w.close(unlink=True)


def test_views_are_zero_copy_across_mappings(make_config: MakeConfig) -> None:
    cfg = make_config(l1_slots=3)
    a = open_l1_rank(cfg, 0, create=True)
    b = open_l1_rank(cfg, 0, create=False)
    try:
        assert a.array.shape == (3, cfg.stride)
        assert a.array.dtype == np.uint8
        a.slot(2)[:] = 7
        assert (b.array[2] == 7).all()
        b.buffer(1)[:4] = b"abcd"
        assert bytes(a.array[1, :4]) == b"abcd"
        # page aligned slot data (DMA and O_DIRECT friendly)
        assert a.array.ctypes.data % 4096 == 0
    finally:
        b.close()
        a.close(unlink=True)
    assert not cfg.l1_file(0).exists()


def test_register_cuda_is_a_noop_without_cuda(make_config: MakeConfig) -> None:
    if cuda_available():
        pytest.skip("CUDA present: covered by the GPU check")
    with open_l1_rank(make_config(), 0) as f:
        assert f.register_cuda() is False
        f.unregister_cuda()


def test_torch_view_shares_memory(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    with open_l1_rank(make_config(l1_slots=2), 0) as f:
        t = f.torch_view()
        assert t.dtype == torch.uint8
        assert tuple(t.shape) == (2, 4096)
        t[1, 0] = 42
        assert f.array[1, 0] == 42


def test_import_does_not_pull_torch() -> None:
    import subprocess
    import sys

    code = "import sys, kvpool_mmap; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
