"""Direct mode at tensor parallelism > 1: every worker publishes its key prefix through a
real `memkv serve`; the scheduler refuses ranks that disagree and says in what."""

from __future__ import annotations

import pytest
from memkv_harness import MemKVServer

IDENT = {
    "model": "m",
    "dtype": "torch.bfloat16",
    "tp_size": 2,
    "world_size": 2,
    "layout": [[[2, 32, 128], 16384]],
    "kv_cache_layout": "NHD",
}


def publish(memkv: MemKVServer, engine_id: str, idents: list[dict[str, object]]) -> None:
    import memkv_client
    from memkv_vllm.naming import prefix_record, publish_key

    with memkv_client.Client(servers=[memkv.address], transport="tcp") as client:
        for rank, ident in enumerate(idents):
            client.put(publish_key(engine_id, rank), prefix_record(ident, "w1", ""))


def adopt(memkv: MemKVServer, engine_id: str, world_size: int) -> bytes:
    import memkv_client
    from memkv_vllm.direct_manager import adopt_prefix

    with memkv_client.Client(servers=[memkv.address], transport="tcp") as client:
        return bytes(adopt_prefix(client, engine_id, world_size, timeout=1))


def test_agreeing_ranks_share_the_prefix_their_keys_use(memkv: MemKVServer) -> None:
    from memkv_vllm.naming import direct_prefix

    publish(memkv, "same", [IDENT, IDENT])
    assert adopt(memkv, "same", 2) == direct_prefix(IDENT, "w1", "")


def test_a_rank_with_another_kv_layout_is_refused_naming_rank_and_field(
    memkv: MemKVServer,
) -> None:
    other = {**IDENT, "layout": [[[2, 128, 32], 16384]], "kv_cache_layout": "HND"}
    publish(memkv, "mixed", [IDENT, IDENT, other, IDENT])
    with pytest.raises(RuntimeError, match="ranks key KV blocks differently") as caught:
        adopt(memkv, "mixed", 4)
    message = str(caught.value)
    assert "rank 2: kv_cache_layout='HND' where rank 0 has 'NHD'" in message
    assert "layout=[[[2, 128, 32], 16384]] where rank 0 has [[[2, 32, 128], 16384]]" in message
    assert "rank 1" not in message  # ranks 1 and 3 agree with rank 0
    assert "rank 3" not in message
