"""A request vLLM serves wholly from its own (HBM) cache costs the scheduler no per-block
work when the store already holds those blocks; blocks the store lost are offered again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_scheduler import BLOCK, Engine, attention_spec, request, scheduler_output
from vllm_marconi_offload.plan import StepPlan

PROMPT = [f"b{i}" for i in range(6)]
BLOCK_IDS = [[1, 2, 3, 4, 5, 6, 7]]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A scheduler that stored the prompt once (request "a" computed it cold)."""
    started = Engine(tmp_path, attention_spec())
    started.report(started.prefill(request("a", PROMPT), BLOCK_IDS))
    started.scheduler.request_finished("a")
    yield started
    started.close()


def served_from_hbm(engine: Engine, req: SimpleNamespace, cached_blocks: int) -> StepPlan:
    """vLLM found `cached_blocks` in its own cache and schedules the rest of the prompt."""
    computed = cached_blocks * BLOCK
    assert engine.lookup(req, computed=computed) == (0, False)
    engine.scheduler.allocated(req, tuple(BLOCK_IDS), 0)
    out = scheduler_output(req, **{req.request_id: BLOCK_IDS})
    out.scheduled_new_reqs[0].num_computed_tokens = computed
    out.num_scheduled_tokens = {req.request_id: req.num_tokens - computed}
    return engine.scheduler.build_metadata(out)


def test_blocks_the_store_holds_are_not_offered_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    offered: list[int] = []
    begin_store = engine.store.begin_store
    monkeypatch.setattr(
        engine.store,
        "begin_store",
        lambda keys, *a: offered.append(len(keys)) or begin_store(keys, *a),
    )
    plan = served_from_hbm(engine, request("b", PROMPT), cached_blocks=len(PROMPT))
    assert plan.stores == []
    assert offered == []  # not even asked about the six blocks


def test_blocks_the_store_lost_are_offered_again(engine: Engine) -> None:
    assert engine.scheduler.reset() == len(PROMPT)  # the store lost them; HBM still has them

    plan = served_from_hbm(engine, request("b", PROMPT), cached_blocks=len(PROMPT))
    [store] = plan.stores
    assert store.transfers[0].gpu_blocks == tuple(BLOCK_IDS[0][: len(PROMPT)])
