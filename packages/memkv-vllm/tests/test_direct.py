"""``MemKVOffloadingSpec`` (direct mode) on real vLLM (CPU build) and a real ``memkv serve``."""

from __future__ import annotations

from typing import Any

from memkv_harness import BLOCK, PROMPTS, EngineRun, MemKVServer, direct_config


def test_direct_spec_round_trips_within_and_across_processes(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str, baseline: EngineRun
) -> None:
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": direct_config(),
        "phases": [
            {"prompts": PROMPTS},
            # vLLM's own prefix cache is emptied: every hit must come back from MemKV
            {"reset_prefix_cache": True, "prompts": PROMPTS},
        ],
    }
    first = start_engine(spec, **memkv.env()).result()
    assert first.tokens(0) == baseline.tokens(0)
    assert first.tokens(1) == baseline.tokens(0)
    assert first.cached(1)[0] == 6 * BLOCK, first.cached(1)
    assert first.cached(1)[2] == 5 * BLOCK, first.cached(1)

    second = start_engine({**spec, "phases": spec["phases"][:1]}, **memkv.env()).result()
    assert second.tokens(0) == baseline.tokens(0)
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)
