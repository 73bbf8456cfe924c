"""Per-request cache controls (`kv_transfer_params`, `cache_salt`) through `vllm serve`.

One server (L1 of 16 blocks, L2, LRU, a vLLM cache of 32 blocks so repeats miss it) for
every case, restarted once; each case uses its own prompts. A request's cached tokens
(`usage.prompt_tokens_details`) are the tokens our tiers served it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import connector_config
from engine_process import make_prompt
from kv_events_harness import cached_tokens, complete, wait_until
from vllm_env import offline_engine_env
from vllm_server import VllmServer, metric_sum

pytestmark = [pytest.mark.vllm, pytest.mark.newest]

BLOCK = 32
TINY = make_prompt(seed=899, blocks=0, tail=5)


@dataclass
class Server:
    model: str
    folder: Path
    server: VllmServer | None = None

    def start(self) -> Server:
        env = offline_engine_env()
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        config = connector_config(
            cpu_pool_path=str(self.folder / "l1"),
            cpu_bytes_to_use=16 * BLOCK * 1024,  # 16 blocks of 32 KiB
            l2_pool_path=str(self.folder / "l2"),
            l2_bytes_to_use=4 << 20,
            eviction_policy="lru",
        )
        self.server = VllmServer(
            self.model,
            self.folder / "server.log",
            kv_transfer_config=config,
            kv_cache_memory_bytes=1 << 20,
            max_model_len=256,
            env=env,
            extra_args=["--enable-prompt-tokens-details"],
        ).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def ask(self, prompt: list[int], **fields: Any) -> dict[str, Any]:
        assert self.server is not None
        return complete(self.server.url, self.model, prompt, **fields)

    def cached(self, prompt: list[int], **fields: Any) -> int:
        """Tokens of `prompt` served from a cache (ours: vLLM's misses, see `flush`)."""
        assert self.server is not None
        return cached_tokens(self.server.url, self.model, prompt, **fields)

    def flush(self, seed: int) -> None:
        """Push every earlier prompt out of vLLM's own 32-block cache."""
        for i in range(9):
            self.ask(make_prompt(seed=seed + i, blocks=4))

    def gauge(self, name: str, tier: str) -> float:
        assert self.server is not None
        return metric_sum(self.server.metrics(), f"vllm:marconi_offload_{name}", tier=tier)

    def settle(self) -> None:
        """Step the engine until no store is in flight (stats are published per step)."""
        assert self.server is not None
        samples: list[float] = []

        def steady() -> bool:
            samples.append(self.gauge("used_blocks", "l1") + self.gauge("used_blocks", "l2"))
            return len(samples) > 3 and len(set(samples[-3:])) == 1

        assert wait_until(steady, lambda: self.ask(TINY, max_tokens=1))


@pytest.fixture(scope="module")
def server(tiny_llama: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tiny_llama, tmp_path_factory.mktemp("params")).start()
    yield running
    running.stop()


def test_max_offload_tokens_zero_leaves_nothing_in_any_tier(server: Server) -> None:
    prompt = make_prompt(seed=900, blocks=6)
    server.ask(prompt, kv_transfer_params={"max_offload_tokens": 0})
    server.settle()
    assert server.gauge("used_blocks", "l1") == 0
    assert server.gauge("used_blocks", "l2") == 0
    server.flush(seed=910)
    assert server.cached(prompt) == 0


def test_a_bad_value_is_refused_with_its_key_and_the_request_still_served(
    server: Server,
) -> None:
    response = server.ask(TINY, kv_transfer_params={"offload_priority": "forever"})
    error = response["kv_transfer_params"]["marconi_offload_error"]
    assert "offload_priority" in error
    assert "forever" in error
    assert "low, normal, high" in error
    assert response["choices"][0]["text"] is not None


def test_max_load_tokens_caps_the_hit(server: Server) -> None:
    prompt = make_prompt(seed=920, blocks=6)
    server.ask(prompt)
    server.flush(seed=930)
    assert server.cached(prompt, kv_transfer_params={"max_load_tokens": 3 * BLOCK + 7}) == 3 * BLOCK
    server.flush(seed=940)
    assert server.cached(prompt) == 6 * BLOCK


def test_a_high_priority_system_prompt_survives_an_eviction_wave(server: Server) -> None:
    kept = make_prompt(seed=950, blocks=4)
    plain = make_prompt(seed=951, blocks=4)
    server.ask(kept, kv_transfer_params={"offload_priority": "high"})
    server.ask(plain)
    server.flush(seed=960)  # 36 blocks through a 16-block L1 (LRU)
    from_l1 = {"kv_load_tiers": [{"medium": "CPU"}]}
    assert server.cached(kept, kv_transfer_params=from_l1) == 4 * BLOCK
    assert server.cached(plain, kv_transfer_params=from_l1) == 0  # evicted: L2 holds it


def test_different_cache_salts_never_share_an_offloaded_block(server: Server) -> None:
    prompt = make_prompt(seed=970, blocks=6)
    server.ask(prompt, cache_salt="tenant-a")
    server.flush(seed=980)
    assert server.cached(prompt, cache_salt="tenant-b") == 0
    assert server.cached(prompt) == 0
    server.flush(seed=990)
    assert server.cached(prompt, cache_salt="tenant-a") == 6 * BLOCK
    server.stop()
    server.start()  # L1 is gone; L2 holds both tenants' blocks
    assert server.cached(prompt, cache_salt="tenant-c") == 0
    assert server.cached(prompt, cache_salt="tenant-a") == 6 * BLOCK
