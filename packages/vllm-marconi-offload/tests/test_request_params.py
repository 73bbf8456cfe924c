"""`kv_transfer_params` cache controls: parsing, and what the scheduler does with them."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kv_eviction.retention import Retention
from kvpool_mmap import Tier
from test_scheduler import BLOCK, Engine, attention_spec, request, scheduler_output
from vllm_kv_identity import chain_keys
from vllm_marconi_offload.events import BlockInfo, TierEvents
from vllm_marconi_offload.request_params import ERROR_KEY, RequestParams


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Starts schedulers over the store in `tmp_path` (closed after the test)."""
    opened: list[Engine] = []

    def start(**options: Any) -> Engine:
        opened.append(Engine(tmp_path, attention_spec(), **options))
        return opened[-1]

    yield start
    for engine in opened:
        engine.close()


def with_params(req: SimpleNamespace, **params: Any) -> SimpleNamespace:
    req.kv_transfer_params = params
    return req


def test_no_params_means_no_limits() -> None:
    params = RequestParams.from_request(None)
    assert params.loads
    assert params.offload_blocks(9, BLOCK) == 9
    assert params.load_tiers == {Tier.L1, Tier.L2}
    assert params.retention is Retention.NORMAL


@pytest.mark.parametrize(
    ("tiers", "allowed"),
    [
        ([{"medium": "cpu"}], {Tier.L1}),
        ([{"medium": "STORAGE", "locality": "LOCAL"}], {Tier.L2}),
        ([{"locality": "LOCAL"}], {Tier.L1, Tier.L2}),
        ([{"locality": "REMOTE"}], set()),
        ([], set()),
    ],
)
def test_kv_load_tiers_match_vllms_medium_and_locality(
    tiers: list[dict[str, str]], allowed: set[Tier]
) -> None:
    assert RequestParams.parse({"kv_load_tiers": tiers}).load_tiers == allowed


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_offload_tokens": -1}, r"\['max_offload_tokens'\] must be an integer >= 0.*-1"),
        ({"max_load_tokens": "64"}, r"\['max_load_tokens'\] must be an integer >= 0.*'64'"),
        ({"max_load_tokens": True}, r"max_load_tokens.*True"),
        ({"kv_load_tiers": "CPU"}, r"\['kv_load_tiers'\] must be a list of .*'CPU'"),
        ({"kv_load_tiers": [{"medium": "GPU"}]}, r"medium 'GPU' is unknown.*CPU.*STORAGE"),
        ({"kv_load_tiers": [{"tier": "CPU"}]}, r"got entry \{'tier': 'CPU'\}"),
        (
            {"offload_priority": "urgent"},
            r"\['offload_priority'\] must be one of low, normal, high",
        ),
    ],
)
def test_a_bad_value_disables_offload_for_the_request_and_says_why(
    params: dict[str, Any], message: str
) -> None:
    parsed = RequestParams.from_request(params)
    assert parsed.error is not None
    assert __import__("re").search(message, parsed.error), parsed.error
    assert not parsed.loads
    assert parsed.offload_blocks(9, BLOCK) == 0


def test_kv_transfer_params_that_are_not_an_object_are_refused() -> None:
    params = RequestParams.from_request(["max_load_tokens", 4])  # type: ignore[arg-type]
    assert params.error == "kv_transfer_params must be a JSON object; got ['max_load_tokens', 4]"
    assert not params.loads


def test_max_offload_tokens_zero_stores_nothing(engines: Callable[..., Engine]) -> None:
    engine = engines()
    req = with_params(request("a", ["x", "y", "z"]), max_offload_tokens=0)
    assert engine.prefill(req, [[1, 2, 3, 4]]).stores == []
    capped = with_params(request("b", ["u", "v", "w"]), max_offload_tokens=2 * BLOCK + 1)
    [store] = engine.prefill(capped, [[5, 6, 7, 8]]).stores
    assert store.transfers[0].gpu_blocks == (5, 6)


def test_max_load_tokens_and_load_tiers_cap_the_hit(engines: Callable[..., Engine]) -> None:
    engine = engines()
    engine.report(engine.prefill(request("a", ["x", "y", "z"]), [[1, 2, 3, 4]]))
    engine.scheduler.request_finished("a")
    capped = with_params(request("b", ["x", "y", "z"]), max_load_tokens=2 * BLOCK + 3)
    assert engine.lookup(capped) == (2 * BLOCK, True)
    engine.scheduler.request_finished("b")
    beyond_vllm = with_params(request("c", ["x", "y", "z"]), max_load_tokens=BLOCK)
    assert engine.lookup(beyond_vllm, computed=BLOCK) == (BLOCK, True)
    engine.scheduler.request_finished("c")
    disk_only = with_params(request("d", ["x", "y", "z"]), kv_load_tiers=[{"medium": "STORAGE"}])
    assert engine.lookup(disk_only) == (0, False)


def test_a_rejected_request_is_served_without_offload_and_told_why(
    engines: Callable[..., Engine],
) -> None:
    engine = engines()
    engine.report(engine.prefill(request("a", ["x", "y"]), [[1, 2, 3]]))
    engine.scheduler.request_finished("a")
    bad = with_params(request("b", ["x", "y", "q"]), max_load_tokens=-5)
    assert engine.lookup(bad) == (0, False)
    engine.scheduler.allocated(bad, ([4, 5, 6, 7],), 0)
    assert engine.scheduler.build_metadata(scheduler_output(bad, b=[[4, 5, 6, 7]])).stores == []
    error = engine.scheduler.request_finished("b")
    assert error is not None
    assert "max_load_tokens" in error
    assert ERROR_KEY == "marconi_offload_error"


def test_low_priority_blocks_never_reach_l2(engines: Callable[..., Engine]) -> None:
    engine = engines(l2=True)
    secret = with_params(request("a", ["s", "t"]), offload_priority="low")
    engine.report(engine.prefill(secret, [[1, 2, 3]]))
    engine.report(engine.prefill(request("b", ["u", "v"]), [[4, 5, 6]]))
    engine.store.flush()
    assert set(engine.store.keys(Tier.L2)) == set(
        chain_keys([b"u".ljust(16, b"."), b"v".ljust(16, b".")], 0)
    )


def describe(req: SimpleNamespace, index: int) -> BlockInfo:
    parent = req.block_hashes[index - 1] if index else None
    return BlockInfo(parent, array("i", range(index * BLOCK, (index + 1) * BLOCK)))


def test_events_replayed_give_each_tier_and_a_restart_announces_l2(
    engines: Callable[..., Engine],
) -> None:
    engine = engines(l2=True)
    events = TierEvents(describe)
    engine.scheduler.publish_events(events)
    assert [c.tier for c in engine.scheduler.take_changes()] == [None]  # a fresh start
    replica: dict[Tier, set[bytes]] = {Tier.L1: set(), Tier.L2: set()}
    for i in range(12):  # 36 blocks through a 32-slot L1: evictions
        req = request(f"r{i}", [f"p{i}", f"q{i}", f"r{i}"])
        engine.report(engine.prefill(req, [[1, 2, 3, 4]]))
        engine.scheduler.request_finished(req.request_id)
        engine.store._drain(10)
        for change in engine.scheduler.take_changes():
            assert change.tier is not None
            assert change.info is not None
            assert change.info.token_ids[0] % BLOCK == 0
            (replica[change.tier].add if change.loadable else replica[change.tier].discard)(
                change.key
            )
        assert replica[Tier.L1] == set(engine.store.keys(Tier.L1))
        assert replica[Tier.L2] == set(engine.store.keys(Tier.L2))
    assert engine.store.stats().l1_evictions > 0
    assert engine.store.stats().l2_evictions > 0
    engine.close()  # writes L1's blocks to L2 on the way out: the next start announces L2
    held = events.held(Tier.L2)

    again = engines(l2=True)
    restarted = TierEvents(describe)
    again.scheduler.publish_events(restarted)
    changes = again.scheduler.take_changes()
    assert changes[0].tier is None
    assert {c.key for c in changes[1:]} == held == set(again.store.keys(Tier.L2))
    assert all(c.tier is Tier.L2 and c.info is not None for c in changes[1:])  # saved at exit


@pytest.mark.parametrize("served_from", ["hbm", "l1"])
def test_a_high_priority_request_keeps_blocks_it_found_stored(
    engines: Callable[..., Engine], served_from: str
) -> None:
    """A system prompt first sent without the hint, then with it: whether vLLM's own cache
    or our L1 serves the second request, its blocks outlive a wave of normal ones."""
    engine = engines()
    engine.report(engine.prefill(request("a", ["x", "y", "z"]), [[1, 2, 3, 4]]))
    engine.scheduler.request_finished("a")
    kept = with_params(request("b", ["x", "y", "z"]), offload_priority="high")
    if served_from == "hbm":
        assert engine.lookup(kept, computed=3 * BLOCK) == (0, False)
    else:
        assert engine.lookup(kept) == (3 * BLOCK, True)
        engine.scheduler.allocated(kept, ([5, 6, 7, 8],), 3 * BLOCK)
        assert engine.scheduler.build_metadata(scheduler_output()).loads
        engine.scheduler.on_worker_output({"b"}, None)  # loaded: the blocks are unpinned
    engine.scheduler.request_finished("b")
    for i in range(12):  # 36 normal blocks through a 32-slot L1
        wave = request(f"w{i}", [f"w{i}-{b}" for b in range(3)])
        engine.report(engine.prefill(wave, [[9, 10, 11, 12]]))
        engine.scheduler.request_finished(f"w{i}")
    keys = chain_keys([name.encode().ljust(16, b".") for name in "xyz"], 0)
    assert set(keys) <= set(engine.store.keys(Tier.L1))
