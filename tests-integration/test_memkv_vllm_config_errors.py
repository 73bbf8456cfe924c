"""A bad memkv-vllm setting, and the memkv tier on a CPU-only vLLM, stop the real OpenAI
server seconds after start with one line naming the key, the value and the accepted form:
the first error the user sees, no traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from memkv_harness import direct_config, engine_env, tier_config
from vllm_server import VllmServer, first_error

pytestmark = [pytest.mark.vllm, pytest.mark.newest]


def vllm_tiering(**tier: Any) -> dict[str, Any]:
    """The tier under vLLM's own `TieringOffloadingSpec` (its CPU pool needs a GPU)."""
    config = tier_config(**tier)
    extra = config["kv_connector_extra_config"]
    extra["spec_name"] = "TieringOffloadingSpec"
    del extra["spec_module_path"]
    return config


CASES = {
    "tier-key": (
        tier_config(n_read_threads=0),
        "ERROR memkv-vllm: secondary_tiers[memkv]: n_read_threads must be an integer >= 1, got 0",
    ),
    "direct-budget": (
        direct_config(memkv_stall_budget_s="soon"),
        "ERROR memkv-vllm: kv_connector_extra_config: memkv_stall_budget_s must be a finite "
        "number in [0.01, 60.0], got 'soon'",
    ),
    "tier-on-cpu": (
        vllm_tiering(),
        'ERROR memkv-vllm: the memkv tier ("type": "memkv" in secondary_tiers) needs a CUDA '
        "or XPU GPU",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_memkv_setting_is_the_first_error_in_one_line(
    case: str, tiny_llama: str, tmp_path: Path
) -> None:
    config, expected = CASES[case]
    env = engine_env(MEMKV_SERVERS="127.0.0.1:9")  # never reached: the config stops first
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    server = VllmServer(tiny_llama, tmp_path / "server.log", kv_transfer_config=config, env=env)
    log, seconds = server.refused()
    line = first_error(log)
    print(f"{case}: stopped after {seconds:.1f} s with: {line}")
    assert line.startswith(expected), log
    assert "Traceback" not in log
