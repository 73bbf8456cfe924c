"""Each rank's RDMA NIC under both backends' rule, on fake sysfs trees (the one stand-in
here for GPUs and NICs: `memkv_client.topology` reads them as it reads /sys). The
stores are real `MemKVStore`s; no vLLM."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from memkv_server import MemKVServer
from memkv_vllm.store import StoreConfig
from memkv_vllm.store.memkv import MemKVStore
from test_topology_hosts import GPU, NIC, build


def two_switches(root: Path, frontend: bool = False) -> Path:
    """GPU0 and mlx5_0 on one PCIe switch, GPU1 and mlx5_1 on another; `frontend` adds
    an Ethernet NIC (mlx5_bond_0, another fabric) on GPU1's switch."""
    pci: dict[str, tuple[str, tuple[str, str], int]] = {}
    ib: dict[str, tuple[str, str, str]] = {}
    for g in range(2):
        up, down = 0x10 + 8 * g, 0x11 + 8 * g  # switch upstream / downstream bus
        switch = f"pci0000:00/0000:00:0{g + 1}.0/0000:{up:02x}:00.0"
        pci[f"gpu{g}"] = (f"{switch}/0000:{down:02x}:00.0/0000:{down + 1:02x}:00.0", GPU, 0)
        pci[f"nic{g}"] = (f"{switch}/0000:{down:02x}:01.0/0000:{down + 2:02x}:00.0", NIC, 0)
        ib[f"mlx5_{g}"] = (f"nic{g}", "InfiniBand", "4: ACTIVE")
    if frontend:
        pci["frontend"] = ("pci0000:00/0000:00:02.0/0000:18:00.0/0000:19:02.0/0000:1c:00.0",
                           NIC, 0)  # fmt: skip
        ib["mlx5_bond_0"] = ("frontend", "Ethernet", "4: ACTIVE")
    return build(root, pci, ib)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("MEMKV_CONFIG", "MEMKV_RDMA_DEVICES", "MEMKV_TRANSPORT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEMKV_AUTH_KEY_FILE", str(tmp_path / "auth.key"))  # not the user's


@pytest.fixture
def server(memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch) -> MemKVServer:
    monkeypatch.setenv("MEMKV_SERVERS", memkv.address)
    return memkv


def rank_devices(gpu: int | None, sysfs: Path) -> tuple[str, ...]:
    """The RDMA devices the client of a rank on CUDA device `gpu` is left with."""
    store = MemKVStore(StoreConfig(), False, f"rank {gpu}", gpu, sysfs)
    try:
        devices: tuple[str, ...] = store._client.config.rdma_devices
        return devices
    finally:
        store.close()


def test_each_rank_drives_the_nic_on_its_own_gpus_switch(
    server: MemKVServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysfs = two_switches(tmp_path / "sys")
    caplog.set_level(logging.INFO, "vllm.memkv_vllm")
    assert rank_devices(0, sysfs) == ("mlx5_0",)
    assert rank_devices(1, sysfs) == ("mlx5_1",)  # not the client default mlx5_0
    lines = [r.getMessage() for r in caplog.records if "RDMA device for GPU" in r.getMessage()]
    assert lines[1] == (
        "memkv-vllm: RDMA device for GPU 1: mlx5_1 (PIX; on the GPU's PCIe switch, from "
        "NICs with an active port; candidates: mlx5_0, mlx5_1)"
    )
    # CUDA_VISIBLE_DEVICES=1: this rank's cuda:0 is GPU 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert rank_devices(0, sysfs) == ("mlx5_1",)
    # the scheduler has no GPU: the client's own setting
    assert rank_devices(None, sysfs) == ("mlx5_0",)

    # the rank's store works (TCP here: no RDMA stack on this machine)
    store = MemKVStore(StoreConfig(), True, "rank 1", 1, sysfs)
    src, dst = np.arange(4096, dtype=np.uint8) % 251, np.zeros(4096, np.uint8)
    assert all(store.batch_put([(b"memkv-vllm/nic/a", src, 4096)]))
    assert all(store.batch_get_into([(b"memkv-vllm/nic/a", dst, 4096)]))
    assert np.array_equal(src, dst)
    store.close()


def test_memkv_rdma_devices_narrows_the_candidates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sysfs = two_switches(tmp_path / "sys", frontend=True)
    # GPU1's switch also holds a front-end NIC of another fabric, as close as mlx5_1
    assert rank_devices(1, sysfs) == ("mlx5_bond_0",)
    monkeypatch.setenv("MEMKV_RDMA_DEVICES", "mlx5_0,mlx5_1")
    assert rank_devices(1, sysfs) == ("mlx5_1",)
    assert rank_devices(0, sysfs) == ("mlx5_0",)


@pytest.mark.parametrize("with_store_keys", [False, True])
def test_rdma_devices_in_memkv_config_are_the_candidates(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    with_store_keys: bool,
) -> None:
    sysfs = two_switches(tmp_path / "sys", frontend=True)
    config = tmp_path / "memkv.yaml"
    store_keys = "backend: memkv\n" if with_store_keys else ""  # read past memkv-vllm's keys
    config.write_text(f"{store_keys}rdma_devices: [mlx5_0, mlx5_1]\n")
    monkeypatch.setenv("MEMKV_CONFIG", str(config))
    monkeypatch.setenv("MEMKV_RDMA_DEVICES", "mlx5_bond_0")  # the file wins, as in the client
    caplog.set_level(logging.INFO, "vllm.memkv_vllm")
    assert rank_devices(1, sysfs) == ("mlx5_1",)
    assert f"candidates set by rdma_devices in MEMKV_CONFIG {config}" in caplog.text


def test_without_a_candidate_nic_the_client_setting_stays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpu_alone = {"gpu0": ("pci0000:00/0000:00:01.0/0000:01:00.0", GPU, 0)}
    no_nics = build(tmp_path / "bare", gpu_alone, {})
    assert rank_devices(0, no_nics) == ("mlx5_0",)
    sysfs = two_switches(tmp_path / "sys")
    assert rank_devices(1, sysfs) == ("mlx5_1",)
    monkeypatch.setenv("MEMKV_RDMA_DEVICES", "mlx5_7")  # on no host here
    assert rank_devices(1, sysfs) == ("mlx5_7",)
    monkeypatch.setenv("MEMKV_RDMA_DEVICES", "mlx5_0,mlx5_1")
    monkeypatch.setenv("MEMKV_TRANSPORT", "tcp")  # no RDMA: nothing to choose
    assert rank_devices(1, sysfs) == ("mlx5_0", "mlx5_1")
