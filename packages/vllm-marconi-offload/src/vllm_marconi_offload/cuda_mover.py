"""Asynchronous block transfers between a CUDA KV cache and page-locked L1 rows.

A batch is cut into chunks of whole blocks, moved on two side streams so the PCIe link
stays busy while the next chunk is prepared. For a store, each chunk's layers are gathered
into a GPU staging buffer on the gather stream (one Triton launch; one torch copy per layer
without Triton), then the copy stream moves the buffer to the L1 rows; a load runs the same
pipeline backwards. Loads and stores have their own pair of streams and their own staging
buffers: a store issued while a large load is crossing the link (a request that starts
computing while the rest of its wave still loads) is gathered at once and its D2H copy
runs beside the H2D load, instead of queueing the caller's stream behind the whole load.

Between staging and L1 rows a chunk moves either by DMA, one copy per run of consecutive
slots, or, when its slots are scattered into many runs, by one kernel
that reads or writes the rows over PCIe (issuing one DMA per run would block the engine's
thread for as long as the link is busy). A scattered load skips staging altogether: the
kernel reads the rows straight into the KV blocks.

The caller's stream never waits for the host side of a transfer: a store's caller waits
only for its gathers, so later kernels may overwrite the blocks while the bytes are still
crossing the link. Each call returns an event that completes when the batch has landed.
L1 must be page-locked (`cudaHostRegister`): only then do copies run at the link's speed
asynchronously, and only then can the GPU address the rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .block_copy import LayerBytes
from .config import DEFAULT_STAGING_BYTES, ConfigError
from .triton_copy import GroupCopyPlan

CHUNK_BYTES = 128 << 20
# Loads reuse a buffer once its GPU-local scatter is done, so a few keep the link busy;
# stores reuse one only once it has crossed the link, so they get the rest.
LOAD_RING_CHUNKS = 4
# A chunk whose slots form more runs than this moves by kernel, not one DMA per run.
MAX_DMA_RUNS = 4


def slot_runs(slots: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """(first position, first slot, length) for each run of consecutive slots."""
    start = 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            yield start, slots[start], i - start
            start = i


@dataclass
class _Buffer:
    data: torch.Tensor  # uint8 [chunk_blocks, width] on the GPU
    rows: GroupCopyPlan | None  # moves whole staged rows to L1 rows by kernel
    free: torch.cuda.Event | None = None  # recorded when its last transfer is done


class _Ring:
    """Staging buffers of one width, allocated up front and reused round-robin."""

    def __init__(
        self, device: torch.device, width: int, chunk_blocks: int, count: int, *, kernel: bool
    ) -> None:
        self.chunk_blocks = chunk_blocks
        self.positions = torch.arange(chunk_blocks, device=device)  # a buffer's row ids
        self._buffers = []
        for _ in range(count):
            data = torch.empty((chunk_blocks, width), dtype=torch.uint8, device=device)
            whole = [LayerBytes(data, offset=0, nbytes=width)]
            rows = GroupCopyPlan.build(whole, device) if kernel else None
            self._buffers.append(_Buffer(data, rows))
        self._next = 0

    def take(self) -> _Buffer:
        buffer = self._buffers[self._next]
        self._next = (self._next + 1) % len(self._buffers)
        return buffer


class CudaBlockMover:
    """Moves blocks of every layer of a KV-cache group between the GPU and L1 rows."""

    def __init__(
        self,
        layers: dict[int, list[LayerBytes]],
        device: torch.device,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        *,
        kernel: bool = True,
        direct: bool = False,
        by_layer: bool = False,
        programs_per_sm: int = 1,
    ) -> None:
        """`kernel`: gather and scatter with one Triton launch where the layout allows
        (else one torch copy per layer); `direct`: no staging, the kernel reaches the L1
        rows itself (needs the kernel for every group, else ConfigError); `by_layer`:
        prepare `load_layers` (one kernel per layer); `programs_per_sm`: programs per SM
        of the kernels that cross PCIe (`pcie_programs_per_sm`)."""
        self._layers = layers
        self._device = device
        # Stores: gather (blocks -> staging) then copy (staging -> L1 rows).
        self._gather = torch.cuda.Stream(device=device)
        self._copy = torch.cuda.Stream(device=device)
        # Loads: fetch (L1 rows -> staging) then scatter (staging -> blocks).
        self._fetch = torch.cuda.Stream(device=device)
        self._scatter = torch.cuda.Stream(device=device)
        self._rings: dict[int, _Ring] = {}
        self._load_rings: dict[int, _Ring] = {}
        self._plans: dict[int, GroupCopyPlan] = {}
        for group_id, group in layers.items():
            plan = GroupCopyPlan.build(group, device) if kernel or direct else None
            if plan is not None:
                self._plans[group_id] = plan
            elif direct:
                raise ConfigError(
                    "direct copies need Triton and 8-byte aligned KV pages; set copy_path to async"
                )
        self._direct = direct
        # One plan per layer, for loads that land layer by layer (`load_layers`).
        self._layer_plans: dict[int, list[GroupCopyPlan]] = {}
        for group_id, group in layers.items() if by_layer else ():
            plans = [GroupCopyPlan.build([layer], device) for layer in group]
            if all(plans):
                self._layer_plans[group_id] = [plan for plan in plans if plan is not None]
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._host_programs = programs_per_sm * sms
        share = staging_bytes // max(1, len(layers))  # the groups split the staging budget
        for group_id, group in layers.items():
            width = sum(layer.nbytes for layer in group)
            if width == 0 or direct:
                continue
            chunk = max(1, CHUNK_BYTES // width)
            count = max(2, share // (chunk * width))
            loads = max(1, min(LOAD_RING_CHUNKS, count // 2))
            self._rings[group_id] = _Ring(device, width, chunk, count - loads, kernel=kernel)
            self._load_rings[group_id] = _Ring(device, width, chunk, loads, kernel=kernel)
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile the kernel now rather than on the first hit (Triton compiles each
        variant at its first launch): copy block 0 of each group (and of each group's
        layers, for `load_layers`) out and back, unchanged."""
        for group_id, group in self._layers.items():
            plans = [self._plans.get(group_id), *self._layer_plans.get(group_id, [])]
            width = sum(layer.nbytes for layer in group)
            for plan in filter(None, plans):
                self._round_trip_block_zero(plan, width)
        torch.cuda.synchronize(self._device)

    def _round_trip_block_zero(self, plan: GroupCopyPlan, width: int) -> None:
        scratch = torch.empty((1, width), dtype=torch.uint8, device=self._device)
        first = torch.zeros(1, dtype=torch.long, device=self._device)
        plan.copy(scratch, first, first, to_rows=True)
        plan.copy(scratch, first, first, to_rows=False)

    @property
    def uses_kernel(self) -> bool:
        """True if at least one group moves with the Triton kernel."""
        return bool(self._plans)

    def store(
        self, group_id: int, blocks: Sequence[int], slots: Sequence[int], pool: torch.Tensor
    ) -> torch.cuda.Event:
        """Copy GPU `blocks` into rows `slots` of `pool`; the event marks completion.

        The caller's stream waits only for the gathers (GPU to GPU), so the blocks may be
        overwritten by later kernels while the staged bytes are still crossing the link.
        In direct mode the caller's stream waits for the whole transfer: the kernel reads
        the blocks while it writes them over the link.
        """
        caller = torch.cuda.current_stream(self._device)
        if self._direct:
            return self._direct_copy(group_id, blocks, slots, pool, caller, to_rows=True)
        self._gather.wait_stream(caller)
        ring = self._rings[group_id]
        layers = self._layers[group_id]
        plan = self._plans.get(group_id)
        with torch.cuda.stream(self._gather):
            indices = _index(blocks, self._device)
            slot_ids = _index(slots, self._device)
        positions = ring.positions
        # Read on the copy stream too: keep the allocator from reusing it before it has.
        slot_ids.record_stream(self._copy)
        for begin in range(0, len(blocks), ring.chunk_blocks):
            count = min(ring.chunk_blocks, len(blocks) - begin)
            chunk_slots = slots[begin : begin + count]
            buffer = ring.take()
            staged = buffer.data[:count]
            with torch.cuda.stream(self._gather):
                if buffer.free is not None:
                    self._gather.wait_event(buffer.free)
                index = indices[begin : begin + count]
                if plan is not None:
                    plan.copy(staged, positions[:count], index, to_rows=True)
                else:
                    for layer in layers:
                        part = staged.narrow(1, layer.offset, layer.nbytes)
                        part.copy_(layer.view.index_select(0, index))
                gathered = torch.cuda.Event()
                gathered.record(self._gather)
            with torch.cuda.stream(self._copy):
                self._copy.wait_event(gathered)
                if buffer.rows is not None and _by_kernel(chunk_slots, staged, pool):
                    chunk_ids = slot_ids[begin : begin + count]
                    buffer.rows.copy(
                        pool,
                        chunk_ids,
                        positions[:count],
                        to_rows=True,
                        programs=self._host_programs,
                    )
                else:
                    _rows_copy(staged, pool, chunk_slots, to_pool=True)
                buffer.free = torch.cuda.Event()
                buffer.free.record(self._copy)
        caller.wait_stream(self._gather)
        done = torch.cuda.Event()
        done.record(self._copy)
        return done

    def load(
        self,
        group_id: int,
        slots: Sequence[int],
        blocks: Sequence[int],
        pool: torch.Tensor,
        ends: Sequence[int] | None = None,
    ) -> list[torch.cuda.Event]:
        """Copy rows `slots` of `pool` into GPU `blocks`; one event per entry of `ends`
        (non-decreasing block counts, default `[len(blocks)]`), complete once the first
        `end` blocks have landed, so the requests of a batch can start one by one.

        The caller must not read the blocks before their event completes (the request
        waits for its load in WAITING_FOR_REMOTE_KVS until then).
        """
        ends = [len(blocks)] if ends is None else list(ends)
        caller = torch.cuda.current_stream(self._device)
        if self._direct:
            done = self._direct_copy(group_id, blocks, slots, pool, caller, to_rows=False)
            return [done] * len(ends)
        self._scatter.wait_stream(caller)
        self._fetch.wait_stream(caller)
        ring = self._load_rings[group_id]
        layers = self._layers[group_id]
        plan = self._plans.get(group_id)
        with torch.cuda.stream(self._scatter):
            indices = _index(blocks, self._device)
            if plan is not None:
                slot_ids = _index(slots, self._device)
        positions = ring.positions
        events: list[torch.cuda.Event] = []
        self._record_reached(events, ends, 0)
        for begin in range(0, len(blocks), ring.chunk_blocks):
            count = min(ring.chunk_blocks, len(blocks) - begin)
            if plan is not None and _by_kernel(slots[begin : begin + count], plan, pool):
                with torch.cuda.stream(self._scatter):  # rows straight into the KV blocks
                    chunk_ids = slot_ids[begin : begin + count]
                    plan.copy(
                        pool,
                        chunk_ids,
                        indices[begin : begin + count],
                        to_rows=False,
                        programs=self._host_programs,
                    )
                self._record_reached(events, ends, begin + count)
                continue
            buffer = ring.take()
            staged = buffer.data[:count]
            with torch.cuda.stream(self._fetch):
                if buffer.free is not None:
                    self._fetch.wait_event(buffer.free)
                _rows_copy(staged, pool, slots[begin : begin + count], to_pool=False)
                copied = torch.cuda.Event()
                copied.record(self._fetch)
            with torch.cuda.stream(self._scatter):
                self._scatter.wait_event(copied)
                index = indices[begin : begin + count]
                if plan is not None:
                    plan.copy(staged, positions[:count], index, to_rows=False)
                else:
                    for layer in layers:
                        view = staged.narrow(1, layer.offset, layer.nbytes)
                        layer.view.index_copy_(0, index, view)
                buffer.free = torch.cuda.Event()
                buffer.free.record(self._scatter)
            self._record_reached(events, ends, begin + count)
        return events

    def loads_by_layer(self, group_id: int) -> bool:
        """True if `load_layers` can move this group."""
        return group_id in self._layer_plans

    def load_layers(
        self,
        group_id: int,
        slots: Sequence[int],
        blocks: Sequence[int],
        pool: torch.Tensor,
        order: Sequence[int],
    ) -> list[torch.cuda.Event]:
        """Copy rows `slots` of `pool` into GPU `blocks` one layer at a time, the
        group's layers in `order` (indices), each by one kernel that reads that layer's
        bytes of the rows over PCIe; one event per entry of `order`, complete once that
        layer has landed (and every layer before it in `order`).

        The caller makes each layer's readers wait for its event.
        """
        plans = self._layer_plans[group_id]
        stream = self._fetch
        stream.wait_stream(torch.cuda.current_stream(self._device))
        events: list[torch.cuda.Event] = []
        with torch.cuda.stream(stream):
            block_ids = _index(blocks, self._device)
            row_ids = _index(slots, self._device)
            for layer in order:
                plans[layer].copy(
                    pool, row_ids, block_ids, to_rows=False, programs=self._host_programs
                )
                event = torch.cuda.Event()
                event.record(stream)
                events.append(event)
        return events

    def _record_reached(
        self, events: list[torch.cuda.Event], ends: Sequence[int], landed: int
    ) -> None:
        """Record, on the scatter stream, an event for each end within the first `landed`
        blocks that has none yet."""
        while len(events) < len(ends) and ends[len(events)] <= landed:
            event = torch.cuda.Event()
            event.record(self._scatter)
            events.append(event)

    def _direct_copy(
        self,
        group_id: int,
        blocks: Sequence[int],
        slots: Sequence[int],
        pool: torch.Tensor,
        caller: torch.cuda.Stream,
        *,
        to_rows: bool,
    ) -> torch.cuda.Event:
        """One kernel between GPU `blocks` and pool rows `slots`, on the store copy stream
        or the load fetch stream."""
        stream = self._copy if to_rows else self._fetch
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            block_ids = _index(blocks, self._device)
            row_ids = _index(slots, self._device)
            self._plans[group_id].copy(
                pool, row_ids, block_ids, to_rows=to_rows, programs=self._host_programs
            )
        if to_rows:
            # Later kernels may overwrite the blocks only once they have been read.
            caller.wait_stream(stream)
        done = torch.cuda.Event()
        done.record(stream)
        return done

    def synchronize(self) -> None:
        """Wait for every transfer issued so far."""
        for stream in (self._gather, self._copy, self._fetch, self._scatter):
            stream.synchronize()


def _by_kernel(
    slots: Sequence[int], staged: torch.Tensor | GroupCopyPlan, pool: torch.Tensor
) -> bool:
    """True if a chunk should cross PCIe by kernel: its rows are strided (hybrid groups
    share a row), or its slots form more runs than one DMA each is worth."""
    width = staged.width if isinstance(staged, GroupCopyPlan) else staged.shape[1]
    if width != pool.shape[1]:
        return True
    runs = 1
    for i in range(1, len(slots)):
        if slots[i] != slots[i - 1] + 1:
            runs += 1
            if runs > MAX_DMA_RUNS:
                return True
    return False


def _index(blocks: Sequence[int], device: torch.device) -> torch.Tensor:
    """Block ids on the GPU, copied on the current stream without blocking the host.

    The ids go through pinned memory: a copy from pageable memory would first wait for
    the whole stream (e.g. the forward pass a store waits for) to drain.
    """
    ids = torch.tensor(list(blocks), dtype=torch.long).pin_memory()
    return ids.to(device, non_blocking=True)


def _rows_copy(
    staged: torch.Tensor, pool: torch.Tensor, slots: Sequence[int], *, to_pool: bool
) -> None:
    """One asynchronous DMA per run of consecutive slots (per slot if rows are strided)."""
    width = staged.shape[1]
    whole_rows = width == pool.shape[1]
    for first, slot, length in slot_runs(slots):
        if whole_rows:
            runs = [(first, slot, length)]
        else:
            runs = [(first + k, slot + k, 1) for k in range(length)]
        for pos, row, n in runs:
            host = pool[row : row + n, :width]
            gpu = staged[pos : pos + n]
            if to_pool:
                host.copy_(gpu, non_blocking=True)
            else:
                gpu.copy_(host, non_blocking=True)
