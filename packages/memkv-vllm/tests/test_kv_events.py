"""What memkv-vllm tells vLLM's KV events about the shared store, and the per-request
controls it reads itself (vLLM's own `OffloadKey`s, `OffloadingEvent`s and `ReqContext`)."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm


def test_blocks_are_announced_once_as_remote_storage_and_removed_when_found_gone() -> None:
    from memkv_vllm.kv_events import SharedTierEvents
    from memkv_vllm.lookup import Answer
    from vllm.v1.kv_offload.base import Locality, Medium

    events = SharedTierEvents()
    events.on_job(False, [b"a", b"b"], [])  # a store landed
    events.on_lookup(b"b", Answer.HIT)  # already announced: nothing new
    events.on_lookup(b"c", Answer.HIT)  # another engine stored it: found
    events.on_lookup(b"d", Answer.PENDING)
    events.on_lookup(b"a", Answer.MISS)  # the servers evicted it
    events.on_job(True, [b"c"], [b"b"])  # a load could not find b
    taken = events.take()
    assert [(e.keys, e.removed) for e in taken] == [
        ([b"a", b"b"], False),
        ([b"c"], False),
        ([b"a"], True),
        ([b"b"], True),
    ]
    assert {e.medium for e in taken} == {Medium.STORAGE}
    assert {e.locality for e in taken} == {Locality.REMOTE}
    assert events.take() == []


def test_announced_blocks_are_bounded() -> None:
    from memkv_vllm.kv_events import SharedTierEvents

    made: list[tuple[list[Any], bool]] = []
    events = SharedTierEvents(lambda keys, removed: made.append((keys, removed)), max_announced=2)
    events.present([1, 2, 3])
    events.present([1])  # forgotten as the oldest: announced again
    assert made == [([1, 2, 3], False), ([1], False)]


def context(**params: Any) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    return ReqContext(req_id="r", kv_transfer_params=params or None)


@pytest.mark.parametrize(
    ("priority", "stored"), [(None, True), ("normal", True), ("high", True), ("low", False)]
)
def test_low_priority_requests_are_not_stored(priority: str | None, stored: bool) -> None:
    from memkv_vllm.request_params import stores_to_shared_store

    params = {} if priority is None else {"offload_priority": priority}
    assert stores_to_shared_store(context(**params)) is stored


def test_a_bad_priority_is_named_and_nothing_is_stored(caplog: pytest.LogCaptureFixture) -> None:
    from memkv_vllm.request_params import stores_to_shared_store

    req = context(offload_priority="forever")
    assert stores_to_shared_store(req) is False
    assert stores_to_shared_store(req) is False  # parsed once per request
    warnings = [r.getMessage() for r in caplog.records if "offload_priority" in r.getMessage()]
    assert len(warnings) == 1
    assert "low, normal, high" in warnings[0]
    assert "'forever'" in warnings[0]


def test_kv_load_tiers_can_leave_the_shared_store_out() -> None:
    from memkv_vllm.request_params import loads_from_shared_store
    from vllm.v1.kv_offload.base import Locality, Medium, ReqContext, TierFilter, TierMatcher

    def tiers(*matchers: Any) -> Any:
        return ReqContext(req_id="r", load_tier_filter=TierFilter(matchers=matchers))

    assert loads_from_shared_store(context())
    assert loads_from_shared_store(tiers(TierMatcher(Medium.STORAGE, Locality.REMOTE)))
    assert not loads_from_shared_store(tiers(TierMatcher(locality=Locality.LOCAL)))
    assert not loads_from_shared_store(tiers())
