"""The OpenAI server with the connector answers concurrent requests and reports hits."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import connector_config
from engine_process import make_prompt
from vllm_env import offline_engine_env
from vllm_server import VllmServer, metric_sum

pytestmark = pytest.mark.vllm


def test_concurrent_requests_served_from_l1_when_hbm_is_full(
    tiny_llama: str, tmp_path: Path
) -> None:
    # 8 prompts x 20 blocks of 32 KiB = 5 MiB of KV against a 4 MiB vLLM cache.
    prompts = [make_prompt(seed=50 + i, blocks=20) for i in range(8)]
    env = offline_engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    server = VllmServer(
        tiny_llama,
        tmp_path / "server.log",
        kv_transfer_config=connector_config(cpu_bytes_to_use=32 << 20),
        kv_cache_memory_bytes=4 << 20,
        max_model_len=1024,
        env=env,
    )
    server.start()
    try:
        at_start = server.metrics()
        with ThreadPoolExecutor(max_workers=8) as pool:
            first = [tokens for tokens, _ in pool.map(server.complete, prompts)]
            second = [tokens for tokens, _ in pool.map(server.complete, prompts)]
        samples = server.metrics()
    finally:
        server.stop()
    # every series exists, at zero, before the first request
    for name, labels in [
        ("vllm:marconi_offload_hit_tokens_total", {"tier": "l2"}),
        ("vllm:marconi_offload_used_blocks", {"tier": "l1"}),
        ("vllm:marconi_offload_used_bytes", {"tier": "l2"}),
        ("vllm:marconi_offload_load_seconds_count", {}),
        ("vllm:marconi_offload_store_seconds_count", {}),
    ]:
        assert metric_sum(at_start, name, **labels) == 0
        assert any(key.partition("{")[0] == name for key in at_start), name
    assert all(len(tokens) == 8 for tokens in first)
    assert second == first
    assert metric_sum(samples, "vllm:marconi_offload_hit_tokens_total", tier="l1") > 0
    assert metric_sum(samples, "vllm:marconi_offload_stored_blocks_total") >= 8 * 20
    assert metric_sum(samples, "vllm:marconi_offload_used_blocks", tier="l1") > 0
    l1_bytes = metric_sum(samples, "vllm:marconi_offload_capacity_bytes", tier="l1")
    assert (32 << 20) * 0.9 <= l1_bytes <= 32 << 20
    assert metric_sum(samples, "vllm:marconi_offload_load_seconds_count") > 0
    assert metric_sum(samples, "vllm:marconi_offload_store_seconds_count") > 0
