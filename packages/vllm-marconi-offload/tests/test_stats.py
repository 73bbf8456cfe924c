"""The log lines users grep for, from the counters."""

from __future__ import annotations

from vllm_marconi_offload.stats import HitCounters


def test_hit_line_splits_tokens_and_requests_by_tier() -> None:
    counters = HitCounters()
    for _ in range(4):
        counters.record_lookup(prompt_tokens=1000)
    counters.record_hit(block_size=100, l1=5, l2=0)
    counters.record_hit(block_size=100, l1=2, l2=3)
    counters.record_hit(block_size=100, l1=0, l2=1)
    line = counters.hit_line()
    assert line.startswith("[CPU-OFFLOAD HIT] requests=4 request_hit_rate=75.0%")
    assert "(l1_only=1 l2_only=1 mixed=1)" in line
    assert "token_hit_rate=27.5% (l1=17.5% l2=10.0%)" in line
    assert "hit_tokens=1100 lookup_tokens=4000" in line
