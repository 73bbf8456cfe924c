"""`load_mode: auto`: which same-step load path this host moves fastest.

A same-step load reaches the GPU one of two ways: by the copy engine's DMA through staging
(`same_step`), or layer by layer by kernels whose threads read the L1 rows over PCIe
(`layer_wise`), each attention layer then waiting only for its own layer. How fast the
GPU's cores read host memory depends on the host's PCIe path, so `auto` times both paths
once at start (`load_timing`) and this module decides from the two rates. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_WISE_SHARE = 0.85
"""`layer_wise` is kept while its rate is at least this share of the copy engine's. Its
load overlaps the hit step's forward, which the raw rate does not show: on an H200 it
moved 4 GiB 9% slower than the copy engine yet served a 32k hit 14% sooner
(docs/benchmarks.md). The margin also absorbs timing noise: near-equal rates never flip
the choice."""


@dataclass(frozen=True)
class LoadRates:
    """What timing the two paths found: bytes/s of each, or None where the path does not
    exist here (`note` says why)."""

    layer_wise: float | None
    same_step: float | None
    wave_bytes: int = 0
    seconds: float = 0.0
    note: str = ""
    same_step_label: str = "copy engine"


def choose_load_mode(rates: LoadRates) -> str:
    """`layer_wise` or `same_step`: the path that exists, else `layer_wise` unless its rate
    is under `LAYER_WISE_SHARE` of `same_step`'s."""
    if rates.layer_wise is None:
        return "same_step"
    if rates.same_step is None:
        return "layer_wise"
    return "layer_wise" if rates.layer_wise >= LAYER_WISE_SHARE * rates.same_step else "same_step"


def auto_line(rates: LoadRates, choice: str) -> str:
    """The one log line of `auto`: both rates (or why a path was not timed) and the choice,
    e.g. `load_mode auto: layer_wise 21.3 GB/s, same_step (copy engine) 24.9 GB/s ->
    same_step (1024 MiB wave, timed in 0.31 s)`."""
    layer_wise = _rate(rates.layer_wise)
    same_step = _rate(rates.same_step)
    line = (
        f"load_mode auto: layer_wise {layer_wise}, same_step ({rates.same_step_label}) "
        f"{same_step} -> {choice}"
    )
    timed = (
        f"{rates.wave_bytes / (1 << 20):.0f} MiB wave, timed in {rates.seconds:.2f} s"
        if rates.wave_bytes
        else ""
    )
    detail = "; ".join(part for part in (timed, rates.note) if part)
    return f"{line} ({detail})" if detail else line


def _rate(bytes_per_s: float | None) -> str:
    return "not timed" if bytes_per_s is None else f"{bytes_per_s / 1e9:.1f} GB/s"
