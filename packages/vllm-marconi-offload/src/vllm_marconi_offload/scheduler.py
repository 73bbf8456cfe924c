"""Scheduler side of the connector: finds hits, plans loads and stores.

Runs in vLLM's engine-core process and must never block a scheduler step:

* `lookup` (from `get_num_new_matched_tokens`): the longest prefix of the request's block
  hashes held by the store (L1, then L2). L1 blocks are pinned at once; L2 blocks are
  promoted into L1 on the store's I/O threads while vLLM keeps scheduling, and the request
  is asked about again (`None`) until they are there. A block that fails its checksum on
  the way up shortens the hit: vLLM recomputes those tokens. So every hit handed to vLLM
  is already in L1, and the L1 -> GPU copy that follows cannot fail.
* `allocated` (from `update_state_after_alloc`): pairs the pinned L1 slots with the GPU
  blocks vLLM allocated; the load goes to the workers in the next metadata.
* `build_metadata`: the loads above, and a store for every block that becomes full in this
  step (demote-on-store; admission decides). Store slots stay pinned until every worker
  reported the copy done (`StoreCompletions`), then they are committed.

The store's own index decides hits: vLLM's BlockPool is never touched.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool_mmap import LoadStatus, LoadTicket, StoreTicket, Tier, TieredStore

from . import compat
from .keys import chain_keys
from .layout import SlotLayout
from .metadata import BlockTransfer, OffloadMetadata, StoreCompletions, TransferJob
from .stats import HitCounters


@dataclass
class _Lookup:
    """A request's pinned hit: L1 slots of its first blocks, possibly still promoting."""

    ticket: LoadTicket


@dataclass
class _RequestState:
    request: Any
    block_ids: list[list[int]] = field(default_factory=list)
    stored_blocks: int = 0
    lookup: _Lookup | None = None
    hit_blocks: int = 0
    counted: bool = False


@dataclass
class _PendingStore:
    ticket: StoreTicket
    remaining_workers: int


class OffloadScheduler:
    """Decides what to load and store; owns the `TieredStore` index."""

    def __init__(
        self, store: TieredStore, layout: SlotLayout, block_size: int, world_size: int
    ) -> None:
        self._store = store
        self._layout = layout
        self._block_size = block_size
        self._world_size = world_size
        self._requests: dict[str, _RequestState] = {}
        self._loads_to_send: list[TransferJob] = []
        self._loads_in_flight: dict[str, _Lookup] = {}
        self._stores_in_flight: dict[int, _PendingStore] = {}
        self._job_ids = itertools.count()
        self.counters = HitCounters()

    # -- lookups ---------------------------------------------------------------------
    def lookup(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """External tokens beyond `num_computed_tokens` ready in L1 (None: ask again)."""
        state = self._requests.setdefault(request.request_id, _RequestState(request))
        if state.lookup is None:
            state.lookup = self._start_lookup(request)
            if state.lookup is None:
                self._count_once(state, request, hit_tiers=[])
                return 0, False
        ticket = state.lookup.ticket
        if self._store.poll_load(ticket) is LoadStatus.PENDING:
            return None, False
        state.hit_blocks = ticket.ready_prefix
        self._count_once(state, request, hit_tiers=ticket.tiers[: state.hit_blocks])
        external = state.hit_blocks * self._block_size - num_computed_tokens
        if external <= 0:
            return 0, False
        return external, True

    def _start_lookup(self, request: Any) -> _Lookup | None:
        # Leave at least one token to compute: vLLM needs a forward pass to sample.
        max_blocks = (request.num_tokens - 1) // self._block_size
        hashes = list(request.block_hashes[:max_blocks])
        if not hashes:
            return None
        keys = chain_keys(hashes, group_id=0)
        if not self._store.lookup(keys[:1]):
            return None
        ticket = self._store.begin_load(keys)
        if not ticket.keys:
            self._store.end_load(ticket)
            return None
        return _Lookup(ticket=ticket)

    def _count_once(self, state: _RequestState, request: Any, hit_tiers: Sequence[Tier]) -> None:
        if state.counted:
            return
        state.counted = True
        l1 = sum(1 for tier in hit_tiers if tier is Tier.L1)
        self.counters.record_request(
            block_size=self._block_size,
            prompt_blocks=request.num_prompt_tokens // self._block_size,
            l1=l1,
            l2=len(hit_tiers) - l1,
        )

    # -- allocation --------------------------------------------------------------------
    def allocated(self, request: Any, block_ids: tuple[list[int], ...], external: int) -> None:
        """vLLM allocated GPU blocks; queue the L1 -> GPU load of the external tokens."""
        state = self._requests.setdefault(request.request_id, _RequestState(request))
        state.block_ids = [list(ids) for ids in block_ids]
        if external <= 0 or state.lookup is None:
            self._release_lookup(state)
            return
        end = state.hit_blocks
        start = end - external // self._block_size
        slots = state.lookup.ticket.l1_slots
        transfer = BlockTransfer(
            group_id=0,
            gpu_blocks=tuple(block_ids[0][start:end]),
            slots=tuple(slots[start:end]),
        )
        job = TransferJob(next(self._job_ids), request.request_id, (transfer,))
        self._loads_to_send.append(job)
        self._loads_in_flight[request.request_id] = state.lookup
        state.lookup = None
        state.stored_blocks = max(state.stored_blocks, end)
        self.counters.loaded_blocks += end - start

    def _release_lookup(self, state: _RequestState) -> None:
        if state.lookup is not None:
            self._store.end_load(state.lookup.ticket)
            state.lookup = None

    # -- per step ----------------------------------------------------------------------
    def build_metadata(self, scheduler_output: Any) -> OffloadMetadata:
        """This step's loads, plus stores of every block that becomes full in it."""
        self._store.tick()
        meta = OffloadMetadata(loads=self._loads_to_send)
        self._loads_to_send = []
        num_scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.block_ids = [list(ids) for ids in new.block_ids]
            self._plan_store(state, new.num_computed_tokens + num_scheduled[new.req_id], meta)
        for req_id, new_ids, computed, resumed in compat.cached_requests(scheduler_output):
            state = self._requests.get(req_id)
            if state is None:
                continue
            if resumed:
                state.block_ids = [list(ids) for ids in new_ids or ()]
            elif new_ids:
                for group, ids in zip(state.block_ids, new_ids, strict=False):
                    group.extend(ids)
            self._plan_store(state, computed + num_scheduled.get(req_id, 0), meta)
        return meta

    def _plan_store(self, state: _RequestState, computed_after: int, meta: OffloadMetadata) -> None:
        request = state.request
        full = min(computed_after // self._block_size, len(request.block_hashes))
        if full <= state.stored_blocks or not state.block_ids:
            return
        start = state.stored_blocks
        state.stored_blocks = full
        keys = chain_keys(request.block_hashes[:full], group_id=0)
        new_keys = keys[start:full]
        parents = [keys[i - 1] if i > 0 else None for i in range(start, full)]
        depths = list(range(start, full))
        ticket = self._store.begin_store(new_keys, parents, depths)
        slots = ticket.l1_slots
        gpu_blocks = state.block_ids[0]
        pairs = [
            (gpu_blocks[start + i], slot)
            for i, slot in enumerate(slots)
            if slot is not None and start + i < len(gpu_blocks)
        ]
        if not pairs:
            self._store.abort_store(ticket)
            return
        transfer = BlockTransfer(
            group_id=0,
            gpu_blocks=tuple(b for b, _ in pairs),
            slots=tuple(s for _, s in pairs),
        )
        job = TransferJob(next(self._job_ids), request.request_id, (transfer,))
        meta.stores.append(job)
        self._stores_in_flight[job.job_id] = _PendingStore(ticket, self._world_size)
        self.counters.stored_blocks += len(pairs)

    # -- worker feedback ---------------------------------------------------------------
    def on_worker_output(
        self, finished_recving: set[str] | None, worker_meta: StoreCompletions | None
    ) -> None:
        """Unpin finished loads; commit stores every worker has finished."""
        for req_id in finished_recving or ():
            lookup = self._loads_in_flight.pop(req_id, None)
            if lookup is not None:
                self._store.end_load(lookup.ticket)
        if worker_meta is None:
            return
        for job_id, count in worker_meta.done.items():
            pending = self._stores_in_flight.get(job_id)
            if pending is None:
                continue
            pending.remaining_workers -= count
            if pending.remaining_workers <= 0:
                del self._stores_in_flight[job_id]
                self._store.commit_store(pending.ticket)

    def request_finished(self, req_id: str) -> None:
        """Forget a finished or aborted request and unpin anything it still holds."""
        state = self._requests.pop(req_id, None)
        if state is not None:
            self._release_lookup(state)

    def has_pending_work(self) -> bool:
        return bool(self._loads_to_send or self._stores_in_flight)

    def shutdown(self) -> None:
        self._store.close()
