"""GPU ↔ RDMA NIC PCIe affinity from sysfs, in the ``nvidia-smi topo`` vocabulary.

GPUs are NVIDIA PCI display/3D controllers, numbered in PCI bus order (the order CUDA
uses with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). NICs are the devices under
``/sys/class/infiniband``. The level between two devices comes from their sysfs PCI
paths (``/sys/devices/pci0000:00/0000:00:01.0/...``):

* ``PIX``: at most one PCIe switch (bridge) between them;
* ``PXB``: several bridges, but not the host bridge;
* ``PHB``: through the PCIe host bridge of one root complex;
* ``NODE``: different root complexes on one NUMA node;
* ``SYS``: across NUMA nodes; ``UNKNOWN`` when sysfs does not say.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LEVELS",
    "PciDevice",
    "affinity_table",
    "host_has_nic_per_gpu",
    "list_gpus",
    "list_nics",
    "rdma_affinity",
    "select_rail",
]

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS", "UNKNOWN")
_NVIDIA = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")


@dataclass(frozen=True)
class PciDevice:
    name: str  # BDF for GPUs, device name (mlx5_0) for NICs
    bdf: str
    path: tuple[str, ...]  # root complex first, then bridge/device BDFs
    numa: int


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _device(name: str, dev_dir: Path) -> PciDevice | None:
    try:
        real = Path(os.path.realpath(dev_dir))
    except OSError:
        return None
    parts = real.parts
    roots = [i for i, part in enumerate(parts) if part.startswith("pci")]
    if not roots:
        return None
    chain = parts[roots[0] :]
    numa_text = _read(dev_dir / "numa_node")
    numa = int(numa_text) if numa_text.lstrip("-").isdigit() else -1
    return PciDevice(name, chain[-1], tuple(chain), numa)


def list_gpus(sysfs: str | Path = "/sys") -> list[PciDevice]:
    """NVIDIA GPUs in PCI bus order (index = GPU number)."""
    base = Path(sysfs) / "bus" / "pci" / "devices"
    out = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    for dev in entries:
        if _read(dev / "vendor") != _NVIDIA:
            continue
        if not _read(dev / "class").startswith(_GPU_CLASSES):
            continue
        d = _device(dev.name, dev)
        if d is not None:
            out.append(d)
    return out


def list_nics(sysfs: str | Path = "/sys", devices: list[str] | None = None) -> list[PciDevice]:
    """RDMA devices (optionally only those named in ``devices``), by name."""
    base = Path(sysfs) / "class" / "infiniband"
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return []
    out = []
    for name in names:
        if devices is not None and name not in devices:
            continue
        d = _device(name, base / name / "device")
        if d is not None:
            out.append(d)
    return out


def level(a: PciDevice, b: PciDevice) -> str:
    """The ``nvidia-smi topo`` level between two PCI devices."""
    if a.path[0] != b.path[0]:
        if a.numa >= 0 and a.numa == b.numa:
            return "NODE"
        return "SYS" if a.numa >= 0 and b.numa >= 0 else "UNKNOWN"
    common = 0
    for x, y in zip(a.path, b.path, strict=False):
        if x != y:
            break
        common += 1
    # path = (root complex, root port, [switch ports...], device)
    if common <= 1:
        return "PHB"  # they meet only at the host bridge
    bridges = (len(a.path) - common) + (len(b.path) - common) - 2  # below the meeting point
    return "PIX" if bridges <= 2 else "PXB"


def rdma_affinity(
    gpu: int, devices: list[str] | None = None, sysfs: str | Path = "/sys"
) -> list[tuple[str, str]]:
    """``[(nic, level), ...]`` for GPU ``gpu``, closest first; ``[]`` if unknown."""
    gpus = list_gpus(sysfs)
    if not 0 <= gpu < len(gpus):
        return []
    g = gpus[gpu]
    pairs = [(n.name, level(g, n)) for n in list_nics(sysfs, devices)]
    return sorted(pairs, key=lambda t: (LEVELS.index(t[1]), t[0]))


def select_rail(
    gpu: int, devices: list[str] | None = None, sysfs: str | Path = "/sys"
) -> str | None:
    """The NIC closest to GPU ``gpu`` (ties by name), or None if there is none."""
    ranked = rdma_affinity(gpu, devices, sysfs)
    return ranked[0][0] if ranked else None


def host_has_nic_per_gpu(sysfs: str | Path = "/sys") -> bool:
    """True if every GPU has a NIC at ``PIX`` level (GPUDirect can reach line rate)."""
    gpus = list_gpus(sysfs)
    if not gpus:
        return False
    return all(
        any(lv == "PIX" for _, lv in rdma_affinity(i, None, sysfs)) for i in range(len(gpus))
    )


def affinity_table(sysfs: str | Path = "/sys") -> str:
    """The human-readable table ``memkv net topo`` prints."""
    gpus, nics = list_gpus(sysfs), list_nics(sysfs)
    if not gpus and not nics:
        return "no GPUs/NICs found"
    if not gpus:
        return "no GPUs found; NICs: " + ", ".join(n.name for n in nics)
    if not nics:
        return "no NICs found; GPUs: " + ", ".join(f"GPU{i} {g.bdf}" for i, g in enumerate(gpus))
    width = max(8, *(len(n.name) + 2 for n in nics))
    lines = ["".ljust(18) + "".join(n.name.ljust(width) for n in nics) + "rail"]
    for i, g in enumerate(gpus):
        cells = "".join(level(g, n).ljust(width) for n in nics)
        lines.append(f"GPU{i} {g.bdf}".ljust(18) + cells + (select_rail(i, None, sysfs) or "-"))
    return "\n".join(lines)
