"""KV events of the shared tier: a ZMQ SUB decoding vLLM's KVEventBatch sees each engine
announce, as medium STORAGE with locality REMOTE, the blocks it stored to a real
`memkv serve` and the blocks it found there that another engine stored."""

from __future__ import annotations

from typing import Any

import pytest
from kv_events_harness import Subscriber
from memkv_harness import PROMPTS, tier_config
from memkv_server import MemKVServer
from vllm.distributed.kv_events import BlockRemoved, BlockStored

pytestmark = [pytest.mark.vllm, pytest.mark.newest]


def shared_blocks(events: list[Any]) -> set[Any]:
    stored = set()
    for event in events:
        if getattr(event, "medium", None) != "STORAGE":
            continue
        assert event.locality == "REMOTE"
        assert not isinstance(event, BlockRemoved)  # nothing was evicted here
        if isinstance(event, BlockStored):
            stored.update(event.block_hashes)
    return stored


def test_engines_announce_what_they_stored_and_found_in_the_shared_store(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str
) -> None:
    subscriber = Subscriber()
    try:
        spec = {
            "model": tiny_llama,
            "kv_transfer_config": tier_config(),
            "kv_events_config": {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": subscriber.endpoint,
            },
            "phases": [{"prompts": PROMPTS}],
        }
        start_engine(spec, **memkv.env()).result()
        first = shared_blocks(subscriber.events)
        seen = len(subscriber.events)
        second = start_engine(spec, **memkv.env()).result()  # another process, same store
        found = shared_blocks(subscriber.events[seen:])
    finally:
        subscriber.close()
    assert len(first) >= 13  # every full block of P1, P2 and P3 (as test_memkv_vllm_tier)
    assert second.cached(0)[0] > 0
    assert len(found) >= 11  # P1's and P3's blocks, found in MemKV
    assert found <= first  # the same blocks, by vLLM's own hashes
