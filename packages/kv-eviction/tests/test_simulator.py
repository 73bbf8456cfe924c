"""The simulator on tiny traces whose numbers can be checked by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_eviction import make_policy
from kv_eviction.sim.belady import BeladyPolicy
from kv_eviction.sim.simulator import simulate
from kv_eviction.sim.trace import Request, Trace


def _trace(*chains: tuple[tuple[str, ...], int], block_size: int = 4) -> Trace:
    requests = [Request(float(i), blocks, tokens) for i, (blocks, tokens) in enumerate(chains)]
    return Trace("tiny", block_size, requests)


def belady(trace: Trace) -> BeladyPolicy:
    return BeladyPolicy.for_requests(r.blocks for r in trace.requests)


def test_lru_numbers_by_hand() -> None:
    trace = _trace(
        (("a", "b"), 8),  # cold: store a, b
        (("a", "b", "c"), 10),  # hit a, b (8 tokens); c covers 2 tokens, stored
        (("a", "x"), 8),  # hit a (4); full: b has a child, a is pinned -> evict c
        (("a", "b", "c"), 10),  # hit a, b (8); c stored again, evicting x
    )
    result = simulate(
        trace, make_policy("lru"), capacity=3, kv_bytes_per_token=2, store_partial_blocks=True
    )
    assert result.input_tokens == 36
    assert result.hit_tokens == 20
    assert result.token_hit_rate == pytest.approx(20 / 36)
    assert result.hit_requests == 3
    assert result.request_hit_rate == pytest.approx(0.75)
    assert result.blocks_written == 5
    assert result.bytes_written == 5 * 4 * 2
    assert result.evictions == 2


def test_a_trailing_partial_block_is_never_stored_or_hit_as_in_vllm() -> None:
    trace = _trace((("a", "b", "c"), 10), (("a", "b", "c"), 10))  # c holds 2 of 4 tokens
    result = simulate(trace, make_policy("lru"), capacity=8)
    assert (result.blocks_written, result.hit_tokens) == (2, 8)  # a and b only
    old = simulate(trace, make_policy("lru"), capacity=8, store_partial_blocks=True)
    assert (old.blocks_written, old.hit_tokens) == (3, 10)


def test_marconi_keeps_a_hot_prefix_through_a_burst_that_flushes_lru() -> None:
    trace = _trace(
        (("s",), 4),
        (("s",), 4),
        (("s",), 4),
        (("u1", "u2"), 8),
        (("v1", "v2"), 8),
        (("s",), 4),
    )
    lru = simulate(trace, make_policy("lru"), capacity=4)
    marconi = simulate(trace, make_policy("marconi"), capacity=4)
    assert lru.hit_tokens == 8  # the burst pushed s out
    assert marconi.hit_tokens == 12  # s (3 uses) outranks the deep one-shot blocks


def test_admission_threshold_two_stores_on_the_second_sighting() -> None:
    trace = _trace((("a", "b"), 8), (("a", "b"), 8), (("a", "b"), 8))
    result = simulate(trace, make_policy("lru"), capacity=10, admission_threshold=2)
    assert result.blocks_written == 2
    assert result.hit_tokens == 8  # only the third request hits


def test_belady_bypasses_a_block_never_used_again() -> None:
    trace = _trace((("a",), 4), (("z",), 4), (("a",), 4))
    result = simulate(trace, belady, capacity=1)
    assert result.hit_tokens == 4
    assert result.blocks_written == 1  # z was not kept


def test_a_request_longer_than_the_cache_stores_what_fits() -> None:
    trace = _trace((("a", "b", "c"), 12), (("a", "b", "c"), 12))
    result = simulate(trace, make_policy("marconi"), capacity=2)
    assert result.blocks_written == 2
    assert result.hit_tokens == 8


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        simulate(_trace((("a",), 4)), make_policy("lru"), capacity=0)


CHAINS = st.lists(
    st.lists(st.integers(0, 3), min_size=1, max_size=5).map(tuple), min_size=1, max_size=40
)


@settings(max_examples=80, deadline=None)
@given(paths=CHAINS, capacity=st.integers(1, 8))
def test_belady_is_an_upper_bound(paths: list[tuple[int, ...]], capacity: int) -> None:
    """On random prefix trees (full blocks), no online policy beats the offline one."""
    requests = [
        Request(float(i), tuple(path[: d + 1] for d in range(len(path))), 4 * len(path))
        for i, path in enumerate(paths)
    ]
    trace = Trace("random", 4, requests)
    best = simulate(trace, belady, capacity).hit_tokens
    for name, options in [("lru", {}), ("marconi", {}), ("marconi", {"reuse_mode": "none"})]:
        for threshold in (1, 2):
            online = simulate(
                trace, make_policy(name, **options), capacity, admission_threshold=threshold
            )
            assert online.hit_tokens <= best
