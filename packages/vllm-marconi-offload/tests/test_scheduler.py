"""The scheduler side over a real `TieredStore` (files in a temporary directory), driven
the way vLLM drives it: lookup -> allocated -> build_metadata -> worker reports.

Requests, the KV-cache config and the scheduler output are stand-ins carrying only the
fields the scheduler reads; no vLLM is needed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from kvpool_mmap import L1Overflow, StoreConfig, Tier, TierConfig, TieredStore
from vllm_kv_identity import chain_keys
from vllm_marconi_offload.cost import PROBE_AFTER_SKIPS, LoadCostModel
from vllm_marconi_offload.layout import SlotLayout
from vllm_marconi_offload.plan import StepPlan, StoreReport, TransferJob
from vllm_marconi_offload.scheduler import OffloadScheduler

BLOCK = 4  # tokens per block
PAGE = 256  # bytes of one layer's block


def attention_spec() -> SimpleNamespace:
    return SimpleNamespace(page_size_bytes=PAGE, block_size=BLOCK, head_size=8)


def mamba_spec() -> SimpleNamespace:
    """A state (Mamba) group: checkpointed at block boundaries (`align` mode)."""
    return SimpleNamespace(page_size_bytes=PAGE, block_size=BLOCK, mamba_cache_mode="align")


def kv_cache_config(*specs: SimpleNamespace) -> SimpleNamespace:
    groups = [
        SimpleNamespace(layer_names=[f"g{i}.l0", f"g{i}.l1"], kv_cache_spec=spec)
        for i, spec in enumerate(specs)
    ]
    return SimpleNamespace(kv_cache_groups=groups, num_blocks=64)


def request(req_id: str, blocks: list[str], extra_tokens: int = 1) -> SimpleNamespace:
    """A prompt of `len(blocks)` full blocks (one hash per block) plus `extra_tokens`."""
    tokens = len(blocks) * BLOCK + extra_tokens
    return SimpleNamespace(
        request_id=req_id,
        num_tokens=tokens,
        num_prompt_tokens=tokens,
        block_hashes=[name.encode().ljust(16, b".") for name in blocks],
    )


def scheduler_output(
    *new_requests: SimpleNamespace, **block_ids: list[list[int]]
) -> SimpleNamespace:
    """A step scheduling the whole prompt of each new request (block ids by request id);
    with none, a step that schedules nothing new."""
    new = [
        SimpleNamespace(
            req_id=r.request_id, block_ids=block_ids[r.request_id], num_computed_tokens=0
        )
        for r in new_requests
    ]
    cached = SimpleNamespace(
        req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set()
    )
    return SimpleNamespace(
        total_num_scheduled_tokens=sum(r.num_tokens for r in new_requests),
        num_scheduled_tokens={r.request_id: r.num_tokens for r in new_requests},
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
    )


class Engine:
    """One scheduler over one store, with the calls vLLM makes in order."""

    def __init__(
        self,
        root: Path,
        *specs: SimpleNamespace,
        world_size: int = 1,
        l2: bool = False,
        cost: LoadCostModel | None = None,
        same_step_loads: bool = False,
        l1_overflow: L1Overflow = "demote",
    ) -> None:
        self.kv_cache_config = kv_cache_config(*specs)
        self.layout = SlotLayout.from_kv_cache_config(self.kv_cache_config)
        self.config = StoreConfig(
            stride=self.layout.stride,
            engine_id="sched",
            fingerprint=b"test-scheduler",
            l1=TierConfig(root / "l1", 32 * self.layout.stride * world_size),
            l2=TierConfig(root / "l2", 64 * self.layout.stride * world_size) if l2 else None,
            tp_size=world_size,
            l1_overflow=l1_overflow,
        )
        self.store = TieredStore(self.config)
        self.world_size = world_size
        self.scheduler = OffloadScheduler(
            self.store,
            self.layout,
            BLOCK,
            world_size,
            self.kv_cache_config,
            cost or LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0),
            same_step_loads=same_step_loads,
        )

    def lookup(self, req: SimpleNamespace, computed: int = 0) -> tuple[int | None, bool]:
        return self.scheduler.lookup(req, computed)

    def lookup_ready(self, req: SimpleNamespace, timeout: float = 10.0) -> int:
        """Ask again while L2 blocks are promoted (vLLM does so every step)."""
        deadline = time.monotonic() + timeout
        while True:
            tokens, _ = self.lookup(req)
            if tokens is not None:
                return tokens
            assert time.monotonic() < deadline, "promotion did not finish"
            time.sleep(0.01)

    def prefill(self, req: SimpleNamespace, block_ids: list[list[int]]) -> StepPlan:
        """vLLM computes the whole prompt: no hit, then one step storing its full blocks."""
        assert self.lookup(req) == (0, False)
        self.scheduler.allocated(req, tuple(block_ids), 0)
        return self.scheduler.build_metadata(scheduler_output(req, **{req.request_id: block_ids}))

    def report(self, plan: StepPlan, workers: int | None = None) -> None:
        """`workers` of the engine's workers finished every store of `plan`."""
        count = self.world_size if workers is None else workers
        done = Counter({job.job_id: count for job in plan.stores})
        self.scheduler.on_worker_output(None, StoreReport(done=done, step=plan.step))

    def close(self) -> None:
        self.scheduler.shutdown()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Starts an `Engine` over the store in `tmp_path` (closed after the test)."""
    opened: list[Engine] = []

    def start_engine(*specs: SimpleNamespace, **options: Any) -> Engine:
        opened.append(Engine(tmp_path, *(specs or (attention_spec(),)), **options))
        return opened[-1]

    yield start_engine
    for engine in opened:
        engine.close()


def slots_of(job: TransferJob, group: int = 0) -> tuple[int, ...]:
    return next(t.slots for t in job.transfers if t.group_id == group)


def test_a_stored_prefix_is_pinned_by_its_lookup_and_loaded_into_the_new_blocks(
    start: Callable[..., Engine],
) -> None:
    engine = start()
    first = request("a", ["x", "y", "z"])
    plan = engine.prefill(first, [[1, 2, 3, 4]])
    [store] = plan.stores
    assert store.transfers[0].gpu_blocks == (1, 2, 3)  # the full blocks only
    engine.report(plan)
    engine.scheduler.request_finished("a")

    second = request("b", ["x", "y", "z"], extra_tokens=3)
    assert engine.lookup(second) == (3 * BLOCK, True)
    assert engine.scheduler.reset() == 0  # pinned by the lookup: nothing can be dropped
    engine.scheduler.allocated(second, ([7, 8, 9, 10],), 3 * BLOCK)
    plan = engine.scheduler.build_metadata(scheduler_output())
    [load] = plan.loads
    assert load.req_id == "b"
    assert load.transfers[0].gpu_blocks == (7, 8, 9)
    assert slots_of(load) == slots_of(store)
    assert engine.scheduler.counters.hit_tokens_l1 == 3 * BLOCK
    assert engine.scheduler.counters.loaded_blocks == 3

    assert engine.scheduler.reset() == 0  # still pinned while the load is in flight
    engine.scheduler.on_worker_output({"b"}, None)
    assert engine.scheduler.reset() == 3  # unpinned once the workers finished loading


def test_vllms_own_hit_or_a_partial_one_is_not_offered_again(start: Callable[..., Engine]) -> None:
    engine = start()
    engine.report(engine.prefill(request("a", ["x", "y"]), [[1, 2, 3]]))
    longer = request("b", ["x", "y", "w"])
    assert engine.lookup(longer, computed=BLOCK) == (BLOCK, True)  # beyond vLLM's block
    engine.scheduler.request_finished("b")
    assert engine.lookup(request("c", ["x", "y"]), computed=2 * BLOCK) == (0, False)
    assert engine.lookup(request("d", ["v", "y"])) == (0, False)  # a different first block


def test_a_store_is_committed_only_after_every_worker_reported(
    start: Callable[..., Engine],
) -> None:
    engine = start(world_size=2)
    plan = engine.prefill(request("a", ["x", "y"]), [[1, 2, 3]])
    assert engine.scheduler.has_pending_work()

    engine.report(plan, workers=1)  # rank 0 copied its shard, rank 1 has not yet
    assert engine.lookup(request("b", ["x", "y"])) == (0, False)
    assert engine.scheduler.has_pending_work()

    engine.report(plan, workers=1)
    assert not engine.scheduler.has_pending_work()
    assert engine.lookup(request("c", ["x", "y"])) == (2 * BLOCK, True)


def test_an_unreported_store_is_never_committed(start: Callable[..., Engine]) -> None:
    engine = start()
    engine.prefill(request("a", ["x", "y"]), [[1, 2, 3]])
    engine.scheduler.on_worker_output(None, StoreReport(step=0))  # the step ran, no store done
    assert engine.lookup(request("b", ["x", "y"])) == (0, False)


@pytest.mark.parametrize("same_step_loads", [False, True])
def test_hybrid_hits_need_the_state_checkpoint_at_their_last_block(
    start: Callable[..., Engine], same_step_loads: bool
) -> None:
    """Also under same_step loads: a model with state groups is always loaded
    asynchronously (vLLM reads the state before a same-step load lands)."""
    engine = start(attention_spec(), mamba_spec(), same_step_loads=same_step_loads)
    plan = engine.prefill(request("a", ["x", "y", "z"], extra_tokens=0), [[1, 2, 3], [4, 5, 6]])
    [store] = plan.stores
    # attention: every block; state: only the checkpoint at the last full block
    assert [(t.group_id, t.gpu_blocks) for t in store.transfers] == [(0, (1, 2, 3)), (1, (6,))]
    engine.report(plan)

    hit = request("b", ["x", "y", "z"])
    assert engine.lookup(hit) == (3 * BLOCK, True)
    engine.scheduler.allocated(hit, ([7, 8, 9, 10], [11, 12, 13, 14]), 3 * BLOCK)
    [load] = engine.scheduler.build_metadata(scheduler_output()).loads
    assert not load.same_step
    assert [(t.group_id, t.gpu_blocks) for t in load.transfers] == [(0, (7, 8, 9)), (1, (13,))]
    assert slots_of(load, group=1) == slots_of(store, group=1)

    # Two of its blocks are stored, but no state after the second: no usable hit.
    assert engine.lookup(request("c", ["x", "y", "q"])) == (0, False)


def test_l2_hits_are_recomputed_when_slower_and_probed_after_a_run_of_skips(
    tmp_path: Path, start: Callable[..., Engine]
) -> None:
    writer = Engine(tmp_path, attention_spec(), l2=True)
    plan = writer.prefill(request("a", ["x", "y", "z"]), [[1, 2, 3, 4]])
    for rank_file in writer.store.l1_files:
        rank_file.array[list(slots_of(plan.stores[0]))] = 7  # what a worker copied
    writer.report(plan)
    writer.close()  # flushes L1 to L2; the next engine finds the blocks in L2 only

    # Reading L2 is assumed far slower than recomputing: skip, then probe.
    slow_disk = LoadCostModel(l2_read_bytes_per_s=1.0, prefill_tokens_per_s=1e12)
    engine = start(l2=True, cost=slow_disk)
    for i in range(PROBE_AFTER_SKIPS):
        assert engine.lookup(request(f"skip{i}", ["x", "y", "z"])) == (0, False)
        engine.scheduler.request_finished(f"skip{i}")
    assert engine.scheduler.counters.l2_skipped_blocks == 3 * PROBE_AFTER_SKIPS

    probe = request("probe", ["x", "y", "z"])
    assert engine.lookup_ready(probe) == BLOCK  # only the first block is read
    assert engine.scheduler.counters.l2_skipped_blocks == 3 * PROBE_AFTER_SKIPS + 2
    engine.scheduler.allocated(probe, ([5, 6, 7, 8],), BLOCK)
    [load] = engine.scheduler.build_metadata(scheduler_output()).loads
    assert load.transfers[0].gpu_blocks == (5,)
    assert np.all(engine.store.l1_files[0].array[list(slots_of(load))] == 7)
    assert engine.scheduler.counters.hit_tokens_l2 == BLOCK


@pytest.mark.parametrize(("overflow", "stored"), [("drop_unwritten", 3), ("demote", 0)])
def test_recomputed_l2_hits_are_stored_in_l1_again_under_drop_unwritten(
    tmp_path: Path, start: Callable[..., Engine], overflow: L1Overflow, stored: int
) -> None:
    """An L2 hit recomputed because the disk is slow: under `drop_unwritten` the request's
    store puts its blocks into L1 again, so the next request hits them there, as it would
    without an L2; `demote` leaves them in L2 only."""
    writer = Engine(tmp_path, attention_spec(), l2=True)
    writer.report(writer.prefill(request("a", ["x", "y", "z"]), [[1, 2, 3, 4]]))
    writer.close()  # the blocks are in L2 only now
    slow_disk = LoadCostModel(l2_read_bytes_per_s=1.0, prefill_tokens_per_s=1e12)
    engine = start(l2=True, cost=slow_disk, l1_overflow=overflow)
    plan = engine.prefill(request("b", ["x", "y", "z"]), [[5, 6, 7, 8]])
    assert engine.scheduler.counters.l2_skipped_blocks == 3
    assert sum(len(slots_of(job)) for job in plan.stores) == stored
    engine.report(plan)
    assert engine.store.stats().restores == stored
    tiers = engine.store.lookup(chain_keys(request("c", ["x", "y", "z"]).block_hashes, 0))
    assert tiers == [Tier.L1] * 3 if stored else [Tier.L2] * 3


def test_l2_hits_are_loaded_while_prefill_is_unmeasured(
    tmp_path: Path, start: Callable[..., Engine]
) -> None:
    writer = Engine(tmp_path, attention_spec(), l2=True)
    writer.report(writer.prefill(request("a", ["x", "y"]), [[1, 2, 3]]))
    writer.close()
    engine = start(l2=True)
    assert engine.lookup_ready(request("b", ["x", "y"])) == 2 * BLOCK
    assert engine.scheduler.counters.l2_skipped_blocks == 0


def test_a_finished_request_releases_its_pinned_lookup(start: Callable[..., Engine]) -> None:
    engine = start()
    engine.report(engine.prefill(request("a", ["x", "y"]), [[1, 2, 3]]))
    assert engine.lookup(request("b", ["x", "y"])) == (2 * BLOCK, True)
    assert engine.scheduler.reset() == 0
    engine.scheduler.request_finished("b")  # aborted before allocation
    assert engine.scheduler.reset() == 2


def test_a_same_step_hit_is_scheduled_at_once_and_unpinned_once_every_worker_loaded_it(
    start: Callable[..., Engine],
) -> None:
    engine = start(world_size=2, same_step_loads=True)
    engine.report(engine.prefill(request("a", ["x", "y", "z"]), [[1, 2, 3, 4]]))
    engine.scheduler.request_finished("a")

    hit = request("b", ["x", "y", "z"])
    assert engine.lookup(hit) == (3 * BLOCK, False)  # vLLM schedules it in this step
    engine.scheduler.allocated(hit, ([7, 8, 9, 10],), 3 * BLOCK)
    plan = engine.scheduler.build_metadata(scheduler_output())
    [load] = plan.loads
    assert load.same_step
    assert load.transfers[0].gpu_blocks == (7, 8, 9)
    assert engine.scheduler.has_pending_work()

    # Not reported as a finished receive (vLLM expects none for a scheduled request), but
    # in the workers' report, like a store: one worker of two is not enough.
    engine.scheduler.on_worker_output(None, StoreReport(done=Counter({load.job_id: 1})))
    assert engine.scheduler.reset() == 0
    engine.scheduler.on_worker_output(None, StoreReport(done=Counter({load.job_id: 1})))
    assert not engine.scheduler.has_pending_work()
    assert engine.scheduler.reset() == 3
