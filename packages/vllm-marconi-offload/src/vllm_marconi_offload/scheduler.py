"""Scheduler side of the connector: finds hits, plans loads and stores.

Runs in vLLM's engine-core process and must never block a scheduler step:

* `lookup` (from `get_num_new_matched_tokens`): the longest prefix of the request's block
  hashes held by the store (L1, then L2). Its blocks are pinned at once; L2 blocks are
  promoted into L1 on the store's I/O threads while vLLM keeps scheduling, and the request
  is asked about again (`None`) until they are there. A block that fails its checksum on
  the way up shortens the hit: vLLM recomputes those tokens. So every hit handed to vLLM
  is already in L1, and the L1 -> GPU copy that follows cannot fail.
* `allocated` (from `update_state_after_alloc`): pairs the pinned L1 slots with the GPU
  blocks vLLM allocated; the load goes to the workers in the next metadata.
* `build_metadata`: the loads above, and a store for every block that becomes full in this
  step (demote-on-store; admission decides). Store slots stay pinned until every worker
  reported the copy done (`StoreReport`), then they are committed.

Every KV-cache group is handled. Attention groups need every block of the hit; state
groups (Mamba, linear attention) need only the state checkpointed at the hit's last
block, and hits end on their alignment (`vllm_kv_identity.aligned_external_hit_tokens`).
The store's own index decides hits: vLLM's BlockPool is never touched.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvpool_mmap import LoadStatus, LoadTicket, StoreStats, StoreTicket, Tier, TieredStore
from vllm_kv_identity import aligned_external_hit_tokens, block_key, chain_keys

from . import compat
from .cost import LoadCostModel
from .events import Change, TierEvents
from .journal import DescriptionJournal
from .layout import SlotLayout
from .log import logger
from .plan import BlockTransfer, StepPlan, StoreReport, TransferJob
from .request_params import DEFAULT, RequestParams
from .stats import HitCounters, TransferTimer

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

NULL_BLOCK = 0  # vLLM's placeholder block id (skipped window / unallocated positions)


@dataclass
class _Lookup:
    """A request's pinned hit: one chain ticket per attention group, one state ticket per
    state group (the state at the hit's last block)."""

    blocks: int
    chains: dict[int, LoadTicket]
    states: dict[int, LoadTicket]
    timed: bool = False

    def tickets(self) -> list[LoadTicket]:
        return [*self.chains.values(), *self.states.values()]


@dataclass
class _RequestState:
    request: Request
    params: RequestParams = DEFAULT
    block_ids: list[list[int]] = field(default_factory=list)
    stored_blocks: int = 0
    lookup: _Lookup | None = None
    hit_blocks: int = 0
    counted: bool = False


@dataclass
class _PendingStore:
    tickets: list[StoreTicket]
    remaining_workers: int


@dataclass
class _PendingLoad:
    req_id: str
    lookup: _Lookup
    remaining_workers: int


class OffloadScheduler:
    """Decides what to load and store; owns the `TieredStore` index."""

    def __init__(
        self,
        store: TieredStore,
        layout: SlotLayout,
        block_size: int,
        world_size: int,
        kv_cache_config: KVCacheConfig,
        cost: LoadCostModel,
        *,
        same_step_loads: bool = False,
    ) -> None:
        """`same_step_loads`: hits are scheduled in the step that loads them (vLLM's
        synchronous path; the workers make that step's forward wait for the load). Not on
        a model with state (Mamba) groups: vLLM copies a request's state out of its block
        before the step's connector load could land there, so those loads stay
        asynchronous."""
        self._store = store
        self._cost = cost
        # Bytes read from L2 to promote one group's block: its slot on every rank.
        self._slot_bytes = layout.stride * world_size
        self._block_size = block_size
        self._world_size = world_size
        self._kv_cache_config = kv_cache_config
        self._chain_groups = [g.group_id for g in layout.groups if g.is_attention]
        self._state_groups = [g.group_id for g in layout.groups if not g.is_attention]
        self._same_step = same_step_loads and not self._state_groups
        if same_step_loads and self._state_groups:
            logger.info(
                "load_mode=same_step/layer_wise: this model has state (Mamba) groups %s, whose state "
                "vLLM copies before a same-step load lands; loads stay asynchronous",
                self._state_groups,
            )
        odd = [g.group_id for g in layout.groups if g.block_size != block_size]
        self._enabled = not odd
        if odd:
            logger.warning(
                "KV-cache groups %s use a block size other than %d tokens; offload is "
                "disabled for this model",
                odd,
                block_size,
            )
        self._requests: dict[str, _RequestState] = {}
        self._loads_to_send: list[TransferJob] = []
        self._loads_in_flight: dict[str, _Lookup] = {}
        self._same_step_loads: dict[int, _PendingLoad] = {}
        self._stores_in_flight: dict[int, _PendingStore] = {}
        self._job_ids = itertools.count()
        self._step_ids = itertools.count()
        self.counters = HitCounters()
        self.timer = TransferTimer()
        self._events: TierEvents | None = None

    # -- KV events (only when vLLM publishes them) ---------------------------------------
    def publish_events(self, events: TierEvents) -> None:
        """Report every change of what L1 and L2 hold to `events`, starting with a
        fresh announcement: whatever this engine announced before is gone, and L2 still
        holds what it recovered (described as saved at the last shutdown)."""
        self._events = events
        self._store.tier_listener = events.on_change
        events.adopt(Tier.L2, self._store.keys(Tier.L2))
        journal = self._descriptions_journal()
        if journal is not None:
            events.keep_descriptions(journal)
        events.announce_all()

    def take_changes(self) -> list[Change]:
        """Changes of what the tiers hold since the last call (none without events)."""
        return self._events.take() if self._events is not None else []

    def _descriptions_journal(self) -> DescriptionJournal | None:
        """Where L2's block descriptions are kept across restarts (next to its rank-0 file,
        so they go with it)."""
        config = self._store.config
        if config.l2 is None:
            return None
        l2 = Path(config.l2_file(0))
        return DescriptionJournal(l2.with_name(l2.name + ".events"))

    def _record(self, request: Request, keys: Sequence[bytes], first: int) -> None:
        """Describe `keys`, blocks `first`... of `request`, for their events."""
        events = self._events
        if events is not None:
            for i, key in enumerate(keys):
                events.record(request, key, first + i)

    def _state(self, request: Request) -> _RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            params = RequestParams.from_request(compat.transfer_params(request))
            if params.error is not None:
                logger.warning(
                    "request %s served without offload: %s", request.request_id, params.error
                )
            state = self._requests[request.request_id] = _RequestState(request, params)
        return state

    # -- lookups ---------------------------------------------------------------------
    def lookup(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """External tokens beyond `num_computed_tokens` ready in L1 (None: ask again)."""
        state = self._state(request)
        if state.lookup is None and not state.params.loads:
            self._count_lookup(state)
            return 0, False  # the request asked us not to load (max_load_tokens 0, no tiers)
        if state.lookup is None and self._local_hit_is_complete(request, num_computed_tokens):
            self._count_lookup(state)
            self._skip_stored_local_hit(state, num_computed_tokens)
            return 0, False  # vLLM's own cache has every block we could offer
        if state.lookup is None:
            state.lookup = (
                self._start_lookup(request, state.params, num_computed_tokens)
                if self._enabled
                else None
            )
            if state.lookup is None:
                self._count_lookup(state)
                return 0, False
        tickets = state.lookup.tickets()
        if any(self._store.poll_load(t) is LoadStatus.PENDING for t in tickets):
            return None, False
        self._time_promotion(state.lookup)
        self._count_lookup(state)
        state.hit_blocks = self._ready_blocks(state.lookup)
        hit = state.hit_blocks * self._block_size - num_computed_tokens
        external = aligned_external_hit_tokens(
            max(hit, 0), num_computed_tokens, self._kv_cache_config, num_tokens=request.num_tokens
        )
        if external <= 0:
            return 0, False
        return external, not self._same_step

    def _max_hit_blocks(self, request: Request) -> int:
        """Blocks a hit may cover: hashed ones, leaving at least one token to compute (vLLM
        needs a forward pass to sample)."""
        return min(int(request.num_tokens - 1) // self._block_size, len(request.block_hashes))

    def _local_hit_is_complete(self, request: Request, num_computed_tokens: int) -> bool:
        return num_computed_tokens >= self._max_hit_blocks(request) * self._block_size

    def _skip_stored_local_hit(self, state: _RequestState, num_computed_tokens: int) -> None:
        """vLLM serves the first `num_computed_tokens` from its own cache. If the store holds
        the last of those blocks in every group, they were stored when first computed and
        are not offered again (a request served from HBM costs no per-block work here);
        otherwise they are, so that the store gets back what it lost."""
        blocks = num_computed_tokens // self._block_size
        if blocks <= state.stored_blocks:
            return
        last = state.request.block_hashes[blocks - 1]
        groups = [*self._chain_groups, *self._state_groups]
        if all(block_key(last, group) in self._store for group in groups):
            self._keep_found_blocks(state, blocks)

    def _keep_found_blocks(self, state: _RequestState, end: int) -> None:
        """The request's blocks up to `end` are stored already (found in vLLM's cache or
        loaded) and are not offered again; a request that asks to keep its blocks longer
        (`offload_priority`) moves them up where they are held at a lower priority."""
        retention = state.params.retention
        if retention > DEFAULT.retention and end > state.stored_blocks:
            hashes = state.request.block_hashes[state.stored_blocks : end]
            for group in self._chain_groups:
                self._store.raise_retention(chain_keys(hashes, group), retention)
            for group in self._state_groups:
                self._store.raise_retention([block_key(hashes[-1], group)], retention)
        state.stored_blocks = max(state.stored_blocks, end)

    def _count_lookup(self, state: _RequestState) -> None:
        """Count a request once, when its lookup has an answer (hits follow at allocation)."""
        if not state.counted:
            state.counted = True
            self.counters.record_lookup(state.request.num_prompt_tokens)

    def _time_promotion(self, lookup: _Lookup) -> None:
        """Teach the cost model the L2 read rate from a finished promotion."""
        if lookup.timed:
            return
        lookup.timed = True
        self._cost.on_promotions(lookup.tickets(), self._slot_bytes)

    def _ready_blocks(self, lookup: _Lookup) -> int:
        if any(t.failed for t in lookup.states.values()):
            return 0  # the state at the hit's end is gone: nothing before it is usable
        return min((t.ready_prefix for t in lookup.chains.values()), default=lookup.blocks)

    def _start_lookup(
        self, request: Request, params: RequestParams, num_computed_tokens: int
    ) -> _Lookup | None:
        limit = params.load_blocks(
            self._max_hit_blocks(request), num_computed_tokens, self._block_size
        )
        hashes = list(request.block_hashes[:limit])
        if not hashes:
            return None
        found = len(hashes)
        tiers: list[list[Tier]] = []
        for group in self._chain_groups:
            tiers.append(self._store.lookup(chain_keys(hashes[:found], group)))
            found = min(found, _allowed_prefix(tiers[-1], params.load_tiers))
        found = self._worth_loading(tiers, found)
        blocks = self._state_hit(hashes, found, params.load_tiers)
        if blocks == 0:
            return None
        if self._events is not None:  # blocks known by hash only (L2 after a crash)
            for g in self._chain_groups:
                self._record(request, chain_keys(hashes[:blocks], g), 0)
        chains = {
            g: self._store.begin_load(chain_keys(hashes[:blocks], g)) for g in self._chain_groups
        }
        states = {
            g: self._store.begin_load([block_key(hashes[blocks - 1], g)])
            for g in self._state_groups
        }
        return _Lookup(blocks=blocks, chains=chains, states=states)

    def _worth_loading(self, tiers: list[list[Tier]], found: int) -> int:
        """How much of the `found` hit blocks to load: all, or the hit's L1 prefix when
        recomputing the rest beats reading it from L2 (plus a few L2 blocks to probe)."""
        first_l2 = min(
            (group[:found].index(Tier.L2) for group in tiers if Tier.L2 in group[:found]),
            default=found,
        )
        if first_l2 == found:
            return found
        l2_bytes = sum(group[first_l2:found].count(Tier.L2) for group in tiers) * self._slot_bytes
        blocks = found - first_l2
        load = self._cost.blocks_to_load(blocks, l2_bytes, blocks * self._block_size)
        self.counters.l2_skipped_blocks += blocks - load
        logger.debug(
            "L2 part of a hit: %d blocks, %d loaded (estimates: L2 %.3g B/s, prefill %.3g tokens/s)",
            blocks,
            load,
            self._cost.l2_bytes_per_s,
            self._cost.prefill_tokens_per_s,
        )
        return first_l2 + load

    def _state_hit(self, hashes: Sequence[bytes], found: int, allowed: Collection[Tier]) -> int:
        """Longest hit <= found whose end has every state group's checkpoint stored (in a
        tier the request may load from)."""
        if not self._state_groups:
            return found
        for blocks in range(found, 0, -1):
            end = blocks * self._block_size
            if aligned_external_hit_tokens(end, 0, self._kv_cache_config) != end:
                continue
            if all(
                _allowed_prefix(self._store.lookup([block_key(hashes[blocks - 1], g)]), allowed)
                for g in self._state_groups
            ):
                return blocks
        return 0

    # -- allocation --------------------------------------------------------------------
    def allocated(self, request: Request, block_ids: tuple[list[int], ...], external: int) -> None:
        """vLLM allocated GPU blocks; queue the L1 -> GPU load of the external tokens."""
        state = self._state(request)
        state.block_ids = [list(ids) for ids in block_ids]
        lookup = state.lookup
        if external <= 0 or lookup is None:
            self._release_lookup(state)
            return
        end = state.hit_blocks
        start = end - external // self._block_size
        transfers = []
        for group, ticket in lookup.chains.items():
            transfers.append(
                _transfer(group, block_ids[group][start:end], ticket.l1_slots[start:end])
            )
        for group, ticket in lookup.states.items():
            transfers.append(_transfer(group, block_ids[group][end - 1 : end], ticket.l1_slots))
        job = TransferJob(
            next(self._job_ids), request.request_id, tuple(transfers), same_step=self._same_step
        )
        self._loads_to_send.append(job)
        if self._same_step:
            self._same_step_loads[job.job_id] = _PendingLoad(
                request.request_id, lookup, self._world_size
            )
        else:
            self._loads_in_flight[request.request_id] = lookup
        self.timer.start("load", request.request_id)
        state.lookup = None
        self._keep_found_blocks(state, end)
        self.counters.loaded_blocks += end - start
        tiers = _hit_tiers(lookup, end)[start:end]
        l1 = sum(1 for tier in tiers if tier is Tier.L1)
        self.counters.record_hit(block_size=self._block_size, l1=l1, l2=len(tiers) - l1)

    def _release_lookup(self, state: _RequestState) -> None:
        if state.lookup is not None:
            for ticket in state.lookup.tickets():
                self._store.end_load(ticket)
            state.lookup = None

    # -- per step ----------------------------------------------------------------------
    def build_metadata(self, scheduler_output: SchedulerOutput) -> StepPlan:
        """This step's loads, plus stores of every block that becomes full in it."""
        self._store.tick()
        step = next(self._step_ids)
        self._cost.on_step(step, scheduler_output.total_num_scheduled_tokens)
        meta = StepPlan(loads=self._loads_to_send, step=step)
        self._loads_to_send = []
        if not self._enabled:
            return meta
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

    def _plan_store(self, state: _RequestState, computed_after: int, meta: StepPlan) -> None:
        request = state.request
        computed = min(computed_after // self._block_size, len(request.block_hashes))
        full = state.params.offload_blocks(computed, self._block_size)  # max_offload_tokens
        if full <= state.stored_blocks or not state.block_ids:
            return
        start = state.stored_blocks
        state.stored_blocks = full
        hashes = request.block_hashes[:full]
        retention = state.params.retention
        tickets: list[StoreTicket] = []
        transfers: list[BlockTransfer] = []
        for group in self._chain_groups:
            keys = chain_keys(hashes[max(start - 1, 0) :], group)  # new blocks and a parent
            ticket = self._store.begin_store(
                keys[1:] if start else keys,
                keys[:-1] if start else [None, *keys[:-1]],
                list(range(start, full)),
                retention=retention,
            )
            tickets.append(ticket)
            transfers.append(_transfer(group, state.block_ids[group][start:full], ticket.l1_slots))
            self._record_allocated(request, ticket, start)
        if self._state_groups and computed_after % self._block_size == 0 and full == computed:
            # The state groups checkpoint their state at block boundaries only (and only
            # the current state: none past a max_offload_tokens cap).
            for group in self._state_groups:
                ticket = self._store.begin_store(
                    [block_key(hashes[full - 1], group)], [None], [full - 1], retention=retention
                )
                self._record_allocated(request, ticket, full - 1)
                tickets.append(ticket)
                transfers.append(
                    _transfer(group, state.block_ids[group][full - 1 : full], ticket.l1_slots)
                )
        transfers = [t for t in transfers if t.slots]
        if not transfers:
            for ticket in tickets:
                self._store.abort_store(ticket)
                if self._events is not None:
                    self._events.forget_unheld(ticket.keys)
            return
        job = TransferJob(next(self._job_ids), request.request_id, tuple(transfers))
        meta.stores.append(job)
        self._stores_in_flight[job.job_id] = _PendingStore(tickets, self._world_size)
        self.timer.start("store", job.job_id)
        self.counters.stored_blocks += sum(len(t.slots) for t in transfers)

    def _record_allocated(self, request: Request, ticket: StoreTicket, first: int) -> None:
        """Describe the blocks of a store ticket that got an L1 slot (block `first` + i)."""
        if self._events is not None:
            for i, slot in enumerate(ticket.l1_slots):
                if slot is not None:
                    self._events.record(request, ticket.keys[i], first + i)

    # -- worker feedback ---------------------------------------------------------------
    def on_worker_output(
        self, finished_recving: set[str] | None, report: StoreReport | None
    ) -> None:
        """A step's output is back: time the step the workers ran, unpin finished loads,
        commit the stores every worker has finished."""
        for req_id in finished_recving or ():
            self._load_done(req_id, self._loads_in_flight.pop(req_id, None))
        if report is None:
            return
        self._cost.on_step_done(report.step)
        for job_id, count in report.done.items():
            load = self._same_step_loads.get(job_id)
            if load is not None:
                load.remaining_workers -= count
                if load.remaining_workers <= 0:
                    del self._same_step_loads[job_id]
                    self._load_done(load.req_id, load.lookup)
                continue
            pending = self._stores_in_flight.get(job_id)
            if pending is None:
                continue
            pending.remaining_workers -= count
            if pending.remaining_workers <= 0:
                del self._stores_in_flight[job_id]
                self.timer.finish("store", job_id)
                for store_ticket in pending.tickets:
                    self._store.commit_store(store_ticket)

    def _load_done(self, req_id: str, lookup: _Lookup | None) -> None:
        """Every worker has finished `req_id`'s load: unpin its L1 slots."""
        self.timer.finish("load", req_id)
        if lookup is not None:
            for ticket in lookup.tickets():
                self._store.end_load(ticket)

    def request_finished(self, req_id: str) -> str | None:
        """Forget a finished or aborted request and unpin anything it still holds; why
        its `kv_transfer_params` were rejected, if they were."""
        state = self._requests.pop(req_id, None)
        self.timer.forget("load", req_id)
        if state is None:
            return None
        self._release_lookup(state)
        return state.params.error

    def has_pending_work(self) -> bool:
        return bool(self._loads_to_send or self._stores_in_flight or self._same_step_loads)

    def store_stats(self) -> StoreStats:
        return self._store.stats()

    def reset(self) -> int:
        """Drop every block nothing is using from L1 and L2; the number dropped."""
        dropped = self._store.clear()
        if self._events is not None:  # vLLM's own reset announced that everything is gone
            self._events.announce_all()
        return dropped

    def shutdown(self) -> None:
        self._store.close()
        if self._events is not None:
            self._events.close()  # describes what the close wrote to L2


def _transfer(group: int, gpu_blocks: Sequence[int], slots: Sequence[int | None]) -> BlockTransfer:
    """Pair GPU blocks with slots, skipping unallocated slots and vLLM's null block."""
    pairs = [
        (block, slot)
        for block, slot in zip(gpu_blocks, slots, strict=False)
        if slot is not None and slot >= 0 and block != NULL_BLOCK
    ]
    return BlockTransfer(
        group_id=group,
        gpu_blocks=tuple(block for block, _ in pairs),
        slots=tuple(slot for _, slot in pairs),
    )


def _allowed_prefix(tiers: Sequence[Tier], allowed: Collection[Tier]) -> int:
    """Leading blocks found in tiers the request may load from."""
    for i, tier in enumerate(tiers):
        if tier not in allowed:
            return i
    return len(tiers)


def _hit_tiers(lookup: _Lookup, blocks: int) -> list[Tier]:
    """Where each of the hit's first `blocks` blocks was found (the first group's view)."""
    first = next(iter(lookup.chains.values()), None)
    if first is not None:
        return first.tiers[:blocks]
    state = next(iter(lookup.states.values()))
    return state.tiers[:1] * blocks
