"""GPU<->NIC affinity from a synthetic sysfs tree."""

from __future__ import annotations

import os
from pathlib import Path

from memkv_client import host_has_nic_per_gpu, rdma_affinity, select_rail
from memkv_client.topology import affinity_table

# Two root complexes (NUMA 0 and 1). Root complex 0 has a PCIe switch with GPU0 and
# mlx5_0 on it; GPU1 sits behind a second switch chained below the first; root
# complex 1 holds GPU2 and mlx5_1 on different root ports.
DEVICES = {
    "gpu0": (
        "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
        "0x10de",
        "0x030200",
        0,
    ),
    "nic0": (
        "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0",
        "0x15b3",
        "0x020700",
        0,
    ),
    "gpu1": (
        "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0",
        "0x10de",
        "0x030200",
        0,
    ),
    "gpu2": ("pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de", "0x030000", 1),
    "nic1": ("pci0000:80/0000:80:02.0/0000:82:00.0", "0x15b3", "0x020700", 1),
    "audio": ("pci0000:00/0000:00:1f.3", "0x10de", "0x040300", 0),  # NVIDIA but not a GPU
}


def make_sysfs(root: Path, nics: dict[str, str] | None = None) -> Path:
    nics = {"mlx5_0": "nic0", "mlx5_1": "nic1"} if nics is None else nics
    by_name = {}
    for name, (path, vendor, cls, numa) in DEVICES.items():
        d = root / "devices" / path
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "numa_node").write_text(f"{numa}\n")
        bus = root / "bus" / "pci" / "devices"
        bus.mkdir(parents=True, exist_ok=True)
        os.symlink(d, bus / d.name)
        by_name[name] = d
    ib = root / "class" / "infiniband"
    ib.mkdir(parents=True)
    for ibname, dev in nics.items():
        (ib / ibname).mkdir()
        os.symlink(by_name[dev], ib / ibname / "device")
    return root


def test_levels_and_rails(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path)
    assert rdma_affinity(0, sysfs=sysfs) == [("mlx5_0", "PIX"), ("mlx5_1", "SYS")]
    assert rdma_affinity(1, sysfs=sysfs) == [("mlx5_0", "PXB"), ("mlx5_1", "SYS")]
    assert rdma_affinity(2, sysfs=sysfs) == [("mlx5_1", "PHB"), ("mlx5_0", "SYS")]
    assert select_rail(0, sysfs=sysfs) == "mlx5_0"
    assert select_rail(2, sysfs=sysfs) == "mlx5_1"
    assert select_rail(2, devices=["mlx5_0"], sysfs=sysfs) == "mlx5_0"
    assert select_rail(7, sysfs=sysfs) is None
    assert host_has_nic_per_gpu(sysfs) is False
    table = affinity_table(sysfs)
    assert "GPU0 0000:03:00.0" in table
    assert "PIX" in table
    assert "GPU3" not in table  # the NVIDIA audio function is not a GPU


def test_no_hardware(tmp_path: Path) -> None:
    assert affinity_table(tmp_path) == "no GPUs/NICs found"
    assert select_rail(0, sysfs=tmp_path) is None
    assert host_has_nic_per_gpu(tmp_path) is False
    sysfs = make_sysfs(tmp_path / "s", nics={})
    assert affinity_table(sysfs).startswith("no NICs found; GPUs: GPU0")


def test_this_machine_does_not_crash() -> None:
    assert isinstance(affinity_table(), str)
