"""vllm-marconi-offload at tensor parallelism 2 on real vLLM (two CPU worker processes).

Each rank owns half the KV heads, its own L1/L2 files and its own published layout; a
block is a hit only if every rank has it. The CPU platform's automatic thread binding
wants one NUMA node per rank, so the workers run unbound (`VLLM_CPU_OMP_THREADS_BIND`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import connector_config
from engine_process import make_prompt
from test_marconi_offload import full_blocks, hit_counts, hit_percent
from tp_marks import TP, TP_ENV, TP_MARKS
from vllm_env import EngineRun

pytestmark = TP_MARKS

SHARED = make_prompt(seed=21, blocks=6, tail=0)
PROMPT_A = make_prompt(seed=22, blocks=2, prefix=SHARED)
PROMPT_B = make_prompt(seed=23, blocks=2, prefix=SHARED)


def tp_spec(model: str, phases: list[dict[str, object]], **connector: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "model": model,
        "tensor_parallel_size": TP,
        "max_model_len": 1024,
        "max_num_batched_tokens": 1024,
        "phases": phases,
    }
    if connector:
        spec["kv_transfer_config"] = connector_config(**connector)
    return spec


@pytest.fixture(scope="module")
def tp_baseline(tiny_llama: str, run_engine: Callable[..., EngineRun]) -> EngineRun:
    """The same engine at TP=2 with no connector."""
    return run_engine(tp_spec(tiny_llama, [{"prompts": [PROMPT_A, PROMPT_B]}]), **TP_ENV)


def test_tp2_l1_and_restart_hits_give_identical_tokens_with_per_rank_files(
    tiny_llama: str, run_engine: Callable[..., EngineRun], tp_baseline: EngineRun, tmp_path: Path
) -> None:
    l1, l2 = tmp_path / "l1", tmp_path / "l2"
    pools = {
        "cpu_pool_path": str(l1),
        "cpu_bytes_to_use": 16 << 20,
        "l2_pool_path": str(l2),
        "l2_bytes_to_use": 16 << 20,
        "pool_name": "tp",
    }
    first = run_engine(
        tp_spec(
            tiny_llama,
            [
                {"prompts": [PROMPT_A, PROMPT_B]},
                {"reset_prefix_cache": True, "prompts": [PROMPT_A, PROMPT_B]},
            ],
            **pools,
        ),
        **TP_ENV,
    )
    assert first.tokens(0) == tp_baseline.tokens(0)
    assert first.tokens(1) == tp_baseline.tokens(0)
    # vLLM's own cache was emptied: every cached token came from L1 (both ranks' halves).
    assert first.cached(1) == [full_blocks(PROMPT_A), full_blocks(PROMPT_B)]
    # The connector counts what it served: with same-step loads (the default) A's load is
    # in vLLM's own cache in the step that schedules B, so B takes the shared prefix there.
    assert hit_counts(first)["hit_tokens"] == sum(first.cached(1)) - len(SHARED)
    assert hit_percent(first, "l1") > 0
    # load_mode auto (the default): every rank takes rank 0's choice (a broadcast over the
    # tensor-parallel group); one line says it, from rank 0.
    chosen = [line for line in first.log.splitlines() if "load_mode auto:" in line]
    assert len(chosen) == 1, chosen
    assert "worker rank 0: load_mode auto:" in chosen[0], chosen

    # Each rank mapped its own L1 file, named by tp rank; at a clean exit each removed it
    # and its layout note (L1 is scratch), and left its own L2 file.
    for rank in range(TP):
        line = first.last_line(f"vllm-marconi-offload worker rank {rank}: L1 ")
        assert f"L1 {l1 / f'kvpool-tp-dp0-tp{rank}.l1'}," in line
    assert list(l1.glob("*.l1*")) == []
    assert sorted(p.name for p in l2.glob("*.l2")) == [
        f"kvpool-tp-dp0-tp{rank}.l2" for rank in range(TP)
    ]

    # A new engine process finds A in L2 on both ranks.
    second = run_engine(tp_spec(tiny_llama, [{"prompts": [PROMPT_A]}], **pools), **TP_ENV)
    assert second.tokens(0) == tp_baseline.tokens(0)[:1]
    assert second.cached(0) == [full_blocks(PROMPT_A)]
    assert hit_percent(second, "l2") > 0
