"""GPU ↔ RDMA NIC PCIe affinity from sysfs, in the `nvidia-smi topo` vocabulary.

GPUs are NVIDIA PCI display/3D controllers, numbered in PCI bus order (the order CUDA
uses with `CUDA_DEVICE_ORDER=PCI_BUS_ID`). NICs are the devices under
`/sys/class/infiniband`. The level between two devices comes from their sysfs PCI
paths (`/sys/devices/pci0000:00/0000:00:01.0/...`):

* `PIX`: at most one PCIe switch (bridge) between them;
* `PXB`: several bridges, but not the host bridge;
* `PHB`: through the PCIe host bridge of one root complex;
* `NODE`: different root complexes on one NUMA node;
* `SYS`: across NUMA nodes; `UNKNOWN` when sysfs does not say.

`choose_nic` is what a rank uses at startup: the NIC on its own GPU's PCIe switch,
among the candidates `MEMKV_RDMA_DEVICES` leaves (all NICs with an active port when it
is unset); `memkv net topo` prints every GPU's choice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LEVELS",
    "NicChoice",
    "PciDevice",
    "affinity_table",
    "choice_table",
    "choose_nic",
    "host_has_nic_per_gpu",
    "link_layer",
    "list_gpus",
    "list_nics",
    "physical_gpu",
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
    """RDMA devices (optionally only those named in `devices`), by name."""
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
    """The `nvidia-smi topo` level between two PCI devices."""
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
    """`[(nic, level), ...]` for GPU `gpu`, closest first; `[]` if unknown."""
    gpus = list_gpus(sysfs)
    if not 0 <= gpu < len(gpus):
        return []
    g = gpus[gpu]
    pairs = [(n.name, level(g, n)) for n in list_nics(sysfs, devices)]
    return sorted(pairs, key=lambda t: (LEVELS.index(t[1]), t[0]))


def select_rail(
    gpu: int, devices: list[str] | None = None, sysfs: str | Path = "/sys"
) -> str | None:
    """The NIC closest to GPU `gpu` (ties by name), or None if there is none."""
    ranked = rdma_affinity(gpu, devices, sysfs)
    return ranked[0][0] if ranked else None


def host_has_nic_per_gpu(sysfs: str | Path = "/sys") -> bool:
    """True if every GPU has a NIC at `PIX` level (GPUDirect can reach line rate)."""
    gpus = list_gpus(sysfs)
    if not gpus:
        return False
    return all(
        any(lv == "PIX" for _, lv in rdma_affinity(i, None, sysfs)) for i in range(len(gpus))
    )


def affinity_table(sysfs: str | Path = "/sys") -> str:
    """The human-readable table `memkv net topo` prints."""
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
    lines.append("".ljust(18) + "".join(link_layer(n.name, sysfs).ljust(width) for n in nics))
    return "\n".join(lines)


def choice_table(sysfs: str | Path = "/sys", env: Mapping[str, str] | None = None) -> str:
    """One line per GPU: the NIC `choose_nic` gives it (`memkv net topo`)."""
    gpus = list_gpus(sysfs)
    lines = [f"GPU{i} -> {choose_nic(i, sysfs, env).describe()}" for i in range(len(gpus))]
    return "\n".join(lines) or f"no GPU: {choose_nic(None, sysfs, env).describe()}"


@dataclass(frozen=True)
class NicChoice:
    """The NIC one rank drives its RDMA through, and why."""

    gpu: int | None  # the physical GPU number (PCI bus order), None without one
    nic: str | None  # None: no candidate (Mooncake/pyverbs then pick themselves)
    level: str  # nvidia-smi topo level between the GPU and the NIC ("-" without a GPU)
    candidates: tuple[str, ...]
    reason: str

    def describe(self) -> str:
        pick = self.nic or "none"
        return (
            f"{pick} ({self.level}; {self.reason}; candidates: {', '.join(self.candidates) or '-'})"
        )


def _port_active(sysfs: Path, nic: str) -> bool:
    """False only when sysfs says no port of the NIC is ACTIVE."""
    ports = sysfs / "class" / "infiniband" / nic / "ports"
    states = [_read(p / "state") for p in sorted(ports.glob("*"))] if ports.is_dir() else []
    states = [s for s in states if s]
    return not states or any("ACTIVE" in s for s in states)


def link_layer(nic: str, sysfs: str | Path = "/sys") -> str:
    """`InfiniBand` / `Ethernet` (RoCE) of the NIC's first port, `?` if unknown."""
    ports = Path(sysfs) / "class" / "infiniband" / nic / "ports"
    layers = [_read(p / "link_layer") for p in sorted(ports.glob("*"))] if ports.is_dir() else []
    return next((x for x in layers if x), "?")


def physical_gpu(index: int, env: Mapping[str, str] | None = None) -> int:
    """The PCI-order GPU behind CUDA device `index` (`CUDA_VISIBLE_DEVICES` renumbers)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and 0 <= index < len(ids):
        return int(ids[index])
    return index


def choose_nic(
    gpu: int | None, sysfs: str | Path = "/sys", env: Mapping[str, str] | None = None
) -> NicChoice:
    """The NIC GPU `gpu` (CUDA index) should drive RDMA through.

    Candidates are the NICs named in `MEMKV_RDMA_DEVICES` (comma-separated; use it to
    drop NICs of another fabric), else every NIC whose port is active. The closest one
    wins (`PIX`: on the GPU's own PCIe switch); equally close NICs are spread over GPUs
    by GPU number, so ranks that share no switch with a NIC do not all pile onto one.
    """
    env = os.environ if env is None else env
    named = [d.strip() for d in env.get("MEMKV_RDMA_DEVICES", "").split(",") if d.strip()]
    root = Path(sysfs)
    nics = list_nics(root, named or None)
    if not named:
        nics = [n for n in nics if _port_active(root, n.name)]
    names = tuple(n.name for n in nics)
    source = "MEMKV_RDMA_DEVICES" if named else "NICs with an active port"
    if not nics:
        return NicChoice(None if gpu is None else physical_gpu(gpu, env), None, "-", names,
                         f"no RDMA NIC among {source}")  # fmt: skip
    if gpu is None:
        return NicChoice(None, nics[0].name, "-", names, f"no GPU; first of {source}")
    physical = physical_gpu(gpu, env)
    gpus = list_gpus(root)
    if not 0 <= physical < len(gpus):
        return NicChoice(physical, nics[0].name, "UNKNOWN", names,
                         f"GPU {physical} not in sysfs; first of {source}")  # fmt: skip
    ranked = sorted((LEVELS.index(level(gpus[physical], n)), n.name) for n in nics)
    best = [name for rank, name in ranked if rank == ranked[0][0]]
    pick = best[physical % len(best)]
    lv = LEVELS[ranked[0][0]]
    why = "on the GPU's PCIe switch" if lv == "PIX" else "closest; no NIC on the GPU's switch"
    return NicChoice(physical, pick, lv, names, f"{why}, from {source}")
