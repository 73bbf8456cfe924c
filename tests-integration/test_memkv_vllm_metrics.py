"""The tier's metrics reach vLLM's Prometheus endpoint (real OpenAI server, multiprocess)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from memkv_harness import P1, P3, engine_env, tier_config
from memkv_server import MemKVServer
from vllm_server import VllmServer, metric_sum

pytestmark = pytest.mark.vllm  # a real vLLM server


def _total(samples: dict[str, float], name: str, **labels: str) -> float:
    return metric_sum(samples, name + "_total", **labels) + metric_sum(samples, name, **labels)


def test_tier_metrics_appear_in_prometheus(
    memkv: MemKVServer, tiny_llama: str, tmp_path: Path
) -> None:
    env = engine_env(**memkv.env())
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # a real server: engine in its own process
    server = VllmServer(
        model=tiny_llama, log_path=tmp_path / "vllm.log", kv_transfer_config=tier_config(), env=env
    )
    server.start()
    try:
        server.complete(P1)
        server.complete(P3)
        deadline = time.monotonic() + 60
        while True:
            samples = server.metrics()
            stored = _total(samples, "vllm:kv_offload_memkv_store_bytes")
            if stored > 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert stored >= 11 * 32 * 1024, stored  # 11 full blocks of 32 KiB reached MemKV
        assert _total(samples, "vllm:kv_offload_memkv_blocks", op="store") >= 11
        lookups = "vllm:kv_offload_memkv_lookups"
        assert _total(samples, lookups, result="hit") + _total(samples, lookups, result="miss") > 0
        assert _total(samples, lookups, result="pending") == 0  # retries are not lookups
        assert _total(samples, "vllm:kv_offload_memkv_lookup_rounds") > 0
    finally:
        server.stop()
