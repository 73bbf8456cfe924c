"""`nox -s demo`'s result tables read on a 100-column terminal and name what a CPU run
has (no GPU memory: vLLM's own cache is in RAM there)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def demo(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_connector_demo_table() -> None:
    offload = demo("packages/vllm-marconi-offload/demo/demo_offload.py")
    counts = {"queries": 123456.0, "vllm": 23456.0, "l1": 34567.0, "l2": 45678.0}
    rows = [(label, [([1, 2], 0.0123)] * 24, counts) for label in ("no offload", "first server")]
    lines = offload.table(rows)
    assert max(map(len, lines + offload.LEGEND.splitlines())) <= 100
    assert lines[0].split()[-6:] == ["vLLM", "hit", "L1", "hit", "L2", "hit"]
    assert "HBM" not in "\n".join(lines) + offload.LEGEND


def test_memkv_demo_table() -> None:
    memkv = demo("packages/memkv-vllm/demo/demo_memkv.py")
    rows = [(name, 4, 3520, 96, 88, 2816, 88, 12, 1234.5, 321.25, 456.75) for name in "AB"]
    lines = memkv.table(rows)
    assert max(map(len, lines + memkv.LEGEND.splitlines())) <= 100
    assert [line.split()[-2:] for line in lines[:2]] == [["A", "B"], ["4", "4"]]
    assert lines[-1].split() == ["load", "MB/s", "456.8", "456.8"]
