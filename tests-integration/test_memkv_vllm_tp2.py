"""Direct mode at tensor parallelism 2 on real vLLM (two CPU worker processes) and a real
`memkv serve`: each rank stores its own value of every block, and a second engine
process gets cross-instance hits with the same tokens."""

from __future__ import annotations

from typing import Any

from engine_process import BLOCK
from memkv_harness import PROMPTS, direct_config
from memkv_server import MemKVServer
from tp_marks import TP, TP_ENV, TP_MARKS

pytestmark = TP_MARKS


def test_direct_tp2_cross_instance_hits_give_identical_tokens(
    start_engine: Any, memkv: MemKVServer, tiny_llama: str
) -> None:
    spec = {
        "model": tiny_llama,
        "tensor_parallel_size": TP,
        "kv_transfer_config": direct_config(),
        "phases": [{"prompts": PROMPTS}],
    }
    env = {**memkv.env(), **TP_ENV}
    first = start_engine(spec, **env).result()
    assert first.cached(0)[0] == 0  # MemKV was empty: A computed everything
    items = memkv.lane_totals("items")["items"]
    # P1 (6 blocks), P2 (2 more), P3 (5): one value per block and rank
    assert items >= 13 * TP, items
    assert items % TP == 0, items

    second = start_engine(spec, **env).result()
    assert second.tokens(0) == first.tokens(0)
    # Both ranks' values of P1's and P3's blocks came back from MemKV.
    assert second.cached(0)[0] == 6 * BLOCK, second.cached(0)
    assert second.cached(0)[2] == 5 * BLOCK, second.cached(0)
