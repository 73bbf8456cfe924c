"""KV events of our tiers, as a KV-aware router receives them from `vllm serve`.

One server with L1 (CPU) and L2 (STORAGE) far smaller than the prompts sent, so blocks
are evicted from both and L2 hits are promoted back into L1; then a restart. A ZMQ SUB
decodes vLLM's KVEventBatch and replays the events in order: the blocks each medium then
holds must be exactly what the tiers hold (the connector's gauges, and L2's own pool
files read by kvpool-mmap), and described by the token ids vLLM's GPU events gave them.
Not marked `newest`: it checks the event classes of every supported vLLM version.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import connector_config
from engine_process import make_prompt
from kv_events_harness import Replica, Subscriber, complete, wait_until
from kvpool_mmap import check_l2_files, pool_files
from vllm.distributed.kv_events import AllBlocksCleared, BlockStored
from vllm_env import offline_engine_env
from vllm_server import VllmServer, metric_sum

pytestmark = pytest.mark.vllm

BLOCK = 32
PROMPTS = [make_prompt(seed=300 + i, blocks=6) for i in range(14)]
TINY = make_prompt(seed=399, blocks=0, tail=5)  # no full block: steps the engine, stores nothing


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    sub = Subscriber()
    yield sub
    sub.close()


def start_server(model: str, folder: Path, subscriber: Subscriber) -> VllmServer:
    env = offline_engine_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    config = connector_config(
        cpu_pool_path=str(folder / "l1"),
        cpu_bytes_to_use=16 * BLOCK * 1024,  # 16 blocks of 32 KiB
        l2_pool_path=str(folder / "l2"),
        l2_bytes_to_use=2 << 20,
        eviction_policy="lru",
    )
    server = VllmServer(
        model,
        folder / "server.log",
        kv_transfer_config=config,
        kv_cache_memory_bytes=1 << 20,  # 32 blocks: repeats miss vLLM's own cache
        max_model_len=256,
        env=env,
        extra_args=["--kv-events-config", subscriber.kv_events_config()],
    )
    return server.start()


def l2_file_blocks(folder: Path) -> set[tuple[int, Any]]:
    """The blocks L2's pool files hold, as the events name them (group, int hash)."""
    report = check_l2_files([p for p in pool_files(folder / "l2") if p.suffix == ".l2"])
    return {
        (int.from_bytes(b.key[-4:], "big"), int.from_bytes(b.key[:-4], "big") & (2**64 - 1))
        for b in report.blocks
    }


def announcement(events: list[Any]) -> Replica:
    """The first AllBlocksCleared and the STORAGE stores right after it (a start's)."""
    start = next(i for i, e in enumerate(events) if isinstance(e, AllBlocksCleared))
    replica = Replica()
    for event in events[start:]:
        if not isinstance(event, AllBlocksCleared | BlockStored) or (
            isinstance(event, BlockStored) and event.medium != "STORAGE"
        ):
            break
        replica.apply(event)
    return replica


def settled(server: VllmServer, subscriber: Subscriber) -> Replica:
    """Step the engine until the events' picture of each tier matches its gauges."""

    def matches() -> bool:
        replica = subscriber.replica()
        samples = server.metrics()
        return all(
            len(replica.holds(medium))
            == metric_sum(samples, "vllm:marconi_offload_used_blocks", tier=tier)
            for medium, tier in (("CPU", "l1"), ("STORAGE", "l2"))
        )

    def nudge() -> None:
        complete(server.url, server.model, TINY, max_tokens=1)

    assert wait_until(matches, nudge), "the events never matched the tiers' gauges"
    return subscriber.replica()


def test_replayed_events_give_each_tiers_blocks_across_a_restart(
    tiny_llama: str, tmp_path: Path, subscriber: Subscriber
) -> None:
    server = start_server(tiny_llama, tmp_path, subscriber)
    try:
        for prompt in PROMPTS:
            complete(server.url, tiny_llama, prompt)
        for prompt in PROMPTS[5:7]:  # out of vLLM's cache and L1, still in L2
            complete(server.url, tiny_llama, prompt)
        first = settled(server, subscriber)
        samples = server.metrics()
    finally:
        server.stop()
    assert metric_sum(samples, "vllm:marconi_offload_hit_tokens_total", tier="l2") > 0
    assert first.removed.get("CPU", 0) > 0
    assert first.removed.get("STORAGE", 0) > 0
    assert first.clears == 1  # the fresh start
    for medium in ("CPU", "STORAGE"):
        for block, tokens in first.holds(medium).items():
            assert tokens == first.gpu_tokens[block[1]], "a block described unlike vLLM's"
    on_disk = l2_file_blocks(tmp_path)
    assert on_disk

    seen_before = len(subscriber.events)
    server = start_server(tiny_llama, tmp_path, subscriber)
    try:
        complete(server.url, tiny_llama, PROMPTS[-1])  # an L2 hit after the restart
        second = settled(server, subscriber)
    finally:
        server.stop()
    announced = announcement(subscriber.events[seen_before:])
    assert set(announced.holds("STORAGE")) == on_disk  # L2 announced once, from its files
    assert all(
        tokens == first.gpu_tokens[h] for (_, h), tokens in announced.holds("STORAGE").items()
    )
    assert second.clears == 2
    assert second.holds("CPU")  # the L2 hit, promoted
