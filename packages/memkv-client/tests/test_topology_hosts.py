"""Each rank's RDMA NIC (`choose_nic`, `memkv net topo`) on sysfs trees of real host shapes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from memkv_client.cli import main
from memkv_client.topology import choose_nic

GPU = ("0x10de", "0x030200")
NIC = ("0x15b3", "0x020700")


def build(root: Path, pci: dict[str, tuple[str, tuple[str, str], int]],
          ib: dict[str, tuple[str, str, str]]) -> Path:  # fmt: skip
    """`pci`: name -> (sysfs path under devices/, (vendor, class), numa node);
    `ib`: RDMA device -> (pci name, link layer, port state)."""
    dirs = {}
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for name, (path, (vendor, cls), numa) in pci.items():
        d = root / "devices" / path
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "numa_node").write_text(f"{numa}\n")
        os.symlink(d, bus / d.name)
        dirs[name] = d
    for dev, (name, layer, state) in ib.items():
        port = root / "class" / "infiniband" / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(layer + "\n")
        (port / "state").write_text(state + "\n")
        os.symlink(dirs[name], root / "class" / "infiniband" / dev / "device")
    return root


def hgx(root: Path, frontend_nic_on_gpu1: bool = False) -> Path:
    """HGX-style 8-GPU host: four PCIe switches (two per NUMA node), each fanning out to
    two sub-switches that hold one GPU and one InfiniBand NIC; a storage NIC (Ethernet)
    on a root port of NUMA node 0."""
    pci: dict[str, tuple[str, tuple[str, str], int]] = {}
    ib: dict[str, tuple[str, str, str]] = {}
    for g in range(8):
        numa, sw, sub = g // 4, g // 2, g % 2
        rc = f"{numa * 0x80:02x}"
        top = f"pci0000:{rc}/0000:{rc}:0{sw % 2 + 1}.0/0000:{0x10 + sw:02x}:00.0"
        sub_switch = f"{top}/0000:{0x18 + sw:02x}:0{sub}.0/0000:{0x20 + g:02x}:00.0"
        pci[f"gpu{g}"] = (
            f"{sub_switch}/0000:{0x30 + g:02x}:00.0/0000:{0x40 + g:02x}:00.0",
            GPU,
            numa,
        )
        pci[f"nic{g}"] = (
            f"{sub_switch}/0000:{0x30 + g:02x}:01.0/0000:{0x50 + g:02x}:00.0",
            NIC,
            numa,
        )
        ib[f"mlx5_{g}"] = (f"nic{g}", "InfiniBand", "4: ACTIVE")
    pci["storage"] = ("pci0000:00/0000:00:05.0/0000:70:00.0", NIC, 0)
    ib["mlx5_8"] = ("storage", "Ethernet", "4: ACTIVE")
    if frontend_nic_on_gpu1:  # a front-end RoCE NIC on GPU1's own sub-switch
        gpu1_switch = pci["gpu1"][0].split("/0000:31:00.0")[0]
        pci["frontend"] = (f"{gpu1_switch}/0000:31:02.0/0000:60:00.0", NIC, 0)
        ib["mlx5_bond_0"] = ("frontend", "Ethernet", "4: ACTIVE")
    return build(root, pci, ib)


def test_each_gpu_drives_the_nic_on_its_own_switch(tmp_path: Path) -> None:
    sysfs = hgx(tmp_path)
    for g in range(8):
        choice = choose_nic(g, sysfs, env={})
        assert (choice.nic, choice.level) == (f"mlx5_{g}", "PIX"), choice
    # CUDA_VISIBLE_DEVICES renumbers: this rank's cuda:1 is physical GPU 5
    assert choose_nic(1, sysfs, env={"CUDA_VISIBLE_DEVICES": "4,5"}).nic == "mlx5_5"


def test_fewer_nics_than_ranks_spreads_ranks_over_the_closest_nics(tmp_path: Path) -> None:
    # one NIC per PCIe switch shared by four GPUs (two switches, one per NUMA node), plus
    # a host whose only NICs hang off the root complexes
    pci: dict[str, tuple[str, tuple[str, str], int]] = {}
    ib = {}
    for s in range(2):
        sw = f"pci0000:{s * 8:02x}/0000:{s * 8:02x}:01.0/0000:{s + 1:02x}:00.0"
        for g in range(4):
            pci[f"gpu{s * 4 + g}"] = (
                f"{sw}/0000:{s + 0x10:02x}:0{g}.0/0000:{0x20 + s * 4 + g:02x}:00.0",
                GPU,
                s,
            )
        pci[f"nic{s}"] = (f"{sw}/0000:{s + 0x10:02x}:08.0/0000:{0x30 + s:02x}:00.0", NIC, s)
        ib[f"mlx5_{s}"] = (f"nic{s}", "InfiniBand", "4: ACTIVE")
    sysfs = build(tmp_path / "a", pci, ib)
    picks = [choose_nic(g, sysfs, env={}) for g in range(8)]
    assert [c.nic for c in picks] == ["mlx5_0"] * 4 + ["mlx5_1"] * 4
    assert {c.level for c in picks} == {"PIX"}

    pci = {
        f"gpu{g}": (
            f"pci0000:{(g // 2) * 8:02x}/0000:{(g // 2) * 8:02x}:0{g % 2 + 1}.0/0000:{g + 1:02x}:00.0",
            GPU,
            g // 2,
        )
        for g in range(4)
    }
    pci["nic0"] = ("pci0000:00/0000:00:04.0/0000:40:00.0", NIC, 0)
    pci["nic1"] = ("pci0000:00/0000:00:05.0/0000:41:00.0", NIC, 0)
    ib = {
        "mlx5_0": ("nic0", "InfiniBand", "4: ACTIVE"),
        "mlx5_1": ("nic1", "InfiniBand", "4: ACTIVE"),
    }
    sysfs = build(tmp_path / "b", pci, ib)
    picks = [choose_nic(g, sysfs, env={}) for g in range(4)]
    # GPUs 0/1 share the root complex with both NICs: equally close, spread over them
    assert [(c.nic, c.level) for c in picks[:2]] == [("mlx5_0", "PHB"), ("mlx5_1", "PHB")]
    assert all("no NIC on the GPU's switch" in c.reason for c in picks)
    assert picks[2].level == picks[3].level == "SYS"  # GPUs 2/3 sit on the other socket


def test_memkv_rdma_devices_drops_a_nic_of_another_fabric(tmp_path: Path) -> None:
    sysfs = hgx(tmp_path, frontend_nic_on_gpu1=True)
    # GPU1's switch holds its InfiniBand NIC and a front-end Ethernet NIC: equally close
    unfiltered = choose_nic(1, sysfs, env={})
    assert unfiltered.level == "PIX"
    assert unfiltered.nic == "mlx5_bond_0"
    fabric = ",".join(f"mlx5_{g}" for g in range(8))
    narrowed = choose_nic(1, sysfs, env={"MEMKV_RDMA_DEVICES": fabric})
    assert (narrowed.nic, narrowed.level) == ("mlx5_1", "PIX")
    assert "mlx5_bond_0" not in narrowed.candidates
    assert "MEMKV_RDMA_DEVICES" in narrowed.reason
    only_storage = choose_nic(3, sysfs, env={"MEMKV_RDMA_DEVICES": "mlx5_8"})
    assert (only_storage.nic, only_storage.level) == ("mlx5_8", "PHB")
    assert choose_nic(3, sysfs, env={"MEMKV_RDMA_DEVICES": "mlx5_99"}).nic is None


def test_a_nic_whose_port_is_down_is_not_a_candidate(tmp_path: Path) -> None:
    sysfs = hgx(tmp_path)
    (sysfs / "class" / "infiniband" / "mlx5_2" / "ports" / "1" / "state").write_text("1: DOWN\n")
    choice = choose_nic(2, sysfs, env={})
    assert choice.nic == "mlx5_3"
    assert choice.level == "PXB"
    assert "mlx5_2" not in choice.candidates


def test_net_topo_prints_each_gpus_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = hgx(tmp_path)
    monkeypatch.setenv("MEMKV_RDMA_DEVICES", "mlx5_0,mlx5_8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["net", "topo", "--sysfs", str(sysfs)]) == 0
    out = capsys.readouterr().out
    assert "GPU0 -> mlx5_0 (PIX; on the GPU's PCIe switch" in out
    assert "GPU7 -> mlx5_8 (SYS" in out or "GPU7 -> mlx5_0 (SYS" in out
    assert "InfiniBand" in out
    assert "Ethernet" in out
