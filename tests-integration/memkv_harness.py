"""memkv-vllm's side of the real-engine suites: its prompts, its two connector
configurations, and the engine environment.

Engines get `PYTHONHASHSEED=0` (instances share blocks only with a pinned seed), the AMX
sitecustomize, and `scaffold/` (the CPU copy worker for vLLM's primary CPU tier) on
`PYTHONPATH`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_process import BLOCK, Engine, make_prompt
from vllm_env import offline_engine_env

SCAFFOLD = Path(__file__).resolve().parent / "scaffold"
# vLLM's own KV cache is kept small so that the tier, not HBM, serves repeats.
KV_CACHE_MEMORY_BYTES = 16 << 20

P1 = make_prompt(1, 6)
P2 = make_prompt(2, 2, prefix=P1[: 4 * BLOCK])  # shares 4 blocks with P1
P3 = make_prompt(3, 5)
PROMPTS = [P1, P2, P3]


def engine_env(**extra: str) -> dict[str, str]:
    return offline_engine_env(SCAFFOLD, **extra)


def start_engine(spec: dict[str, Any], folder: Path, **env: str) -> Engine:
    """An engine process with memkv-vllm's KV size (unless `spec` sets one) and environment
    (`env` added)."""
    sized = {"kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES, **spec}
    return Engine(sized, folder, engine_env(**env))


def tier_config(**tier: Any) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "CPUTestTieringSpec",  # TieringOffloadingSpec + CPU copy worker
            "spec_module_path": "cpu_tiering_spec",
            "cpu_bytes_to_use": 8 << 20,
            "block_size": BLOCK,
            "secondary_tiers": [
                {"type": "memkv", "n_read_threads": 2, "n_write_threads": 2, **tier}
            ],
        },
    }


def direct_config(plain_connector: bool = False, **extra: Any) -> dict[str, Any]:
    """The direct spec under MemKVOffloadingConnector (failed loads recompute), or under
    vLLM's plain OffloadingConnector (a failed load stops the engine)."""
    connector: dict[str, Any] = (
        {"kv_connector": "OffloadingConnector"}
        if plain_connector
        else {
            "kv_connector": "MemKVOffloadingConnector",
            "kv_connector_module_path": "memkv_vllm.connector",
            "kv_load_failure_policy": "recompute",
        }
    )
    return {
        **connector,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "MemKVOffloadingSpec",
            "spec_module_path": "memkv_vllm.spec",
            "memkv_num_threads": 2,
            **extra,
        },
    }
