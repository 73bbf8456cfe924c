"""Worker side of the connector: copies blocks between the KV cache and L1.

Runs in each vLLM worker process. Loads start in `start_load_kv`: the requests of an
asynchronous load wait in WAITING_FOR_REMOTE_KVS, so no forward pass reads them before
they are reported; a same-step load's request is in this step's batch, so the step's
forward waits for the load (on the GPU, its stream waits for the load's events). Stores
start in `wait_for_save`, after the forward. With `load_mode="layer_wise"` a same-step load
lands layer by layer where vLLM runs the step's attention layers eagerly, each waiting only
for its own layer (`LayerWaits`), so the load overlaps the forward. `load_mode="auto"`
times both paths when the KV cache is registered and keeps one (`load_choice`).

On a CUDA KV cache with a page-locked L1 both run asynchronously (`CudaBlockMover`): a
load is reported finished, and a store committed, only once its events have completed, so
the scheduler never unpins or publishes an L1 slot whose copy is still in flight. Later
kernels wait only for a store's GPU-side gather, never for its PCIe transfer. All jobs of
a step move together: one mover call per KV-cache group, whatever the number of requests.
Elsewhere (CPU vLLM, or `copy_path="generic"`) `BlockCopier` copies synchronously.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
from kvpool_mmap import StoreConfig, open_l1_rank
from vllm_kv_identity.block_copy import BlockCopier

from .block_copy import LayerBytes, layer_views, physical_layout, slot_copier
from .config import DEFAULT_STAGING_BYTES, OffloadConfig
from .cuda_mover import CudaBlockMover
from .layer_waits import LayerWaits
from .layout import SlotLayout
from .load_choice import LoadRates, auto_line, choose_load_mode
from .load_timing import time_load_paths
from .log import logger
from .metadata import OffloadMetadata, TransferJob, WorkerReport
from .pool import (
    physical_layout_file,
    publish_physical_layout,
    reclaim_anonymous_l1,
    with_physical_layout,
)

_K = TypeVar("_K")


def _same(choice: str) -> str:
    return choice


class OffloadWorker:
    """Executes the scheduler's transfer jobs against this rank's L1 file."""

    def __init__(
        self,
        store_config: StoreConfig,
        layout: SlotLayout,
        rank: int,
        config: OffloadConfig,
        *,
        agree: Callable[[str], str] = _same,
    ) -> None:
        """`config`: the connector's settings (load mode, copy path); `agree`: called by
        every tensor-parallel rank with its `auto` choice, returns the one all ranks use
        (rank 0's)."""
        self._store_config = store_config
        self._layout = layout
        self._rank = rank
        self._config = config
        self._agree = agree
        self._layer_wise = config.load_mode == "layer_wise"
        self._layer_waits: LayerWaits[torch.cuda.Event] = LayerWaits(
            {group.group_id: [layer.name for layer in group.layers] for group in layout.groups}
        )
        self._copier: BlockCopier | None = None
        self._mover: CudaBlockMover | None = None
        self._l1: object | None = None
        self._pool: torch.Tensor | None = None
        self._finished_loads: set[str] = set()
        self._finished_jobs: Counter[int] = Counter()  # stores and same-step loads
        self._loads_in_flight: list[tuple[str, list[torch.cuda.Event]]] = []
        self._jobs_in_flight: list[tuple[int, list[torch.cuda.Event]]] = []
        self._step = -1
        self._reported_step = -1
        self._unpublish: Callable[[], object] | None = None

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Map the KV cache tensors, create this rank's L1 file and, under
        `load_mode="auto"`, choose the load path."""
        mode = self._config.copy_path
        layers = layer_views(self._layout, kv_caches)
        physical = physical_layout(self._layout, kv_caches)
        reclaim_anonymous_l1(self._store_config)
        l1 = open_l1_rank(  # locks the pool before anything is written
            with_physical_layout(self._store_config, physical), rank=self._rank, create=True
        )
        publish_physical_layout(self._store_config, self._rank, physical)
        # Removed with the L1 file, also where vLLM never calls shutdown (the L1 file's own
        # finalizer removes it at interpreter exit; so does this one the note).
        note = physical_layout_file(self._store_config, self._rank)
        self._unpublish = weakref.finalize(self, note.unlink, missing_ok=True)
        first = next(iter(kv_caches.values()))
        registered = bool(first.is_cuda and l1.register_cuda())
        self._l1 = l1
        self._pool = l1.torch_view()
        self._copier = slot_copier(layers, self._pool)
        if registered and mode != "generic":
            self._mover = CudaBlockMover(
                layers,
                first.device,
                self._config.staging_bytes or DEFAULT_STAGING_BYTES,
                kernel=mode != "async-per-layer",
                direct=mode == "direct",
                by_layer=self._config.load_mode in ("layer_wise", "auto"),
                programs_per_sm=self._config.pcie_programs_per_sm,
            )
        logger.info(
            "vllm-marconi-offload worker rank %d: L1 %s, %d slots of %d bytes, %s copies",
            self._rank,
            l1.path,
            self._pool.shape[0],
            self._pool.shape[1],
            _describe(self._mover, mode),
        )
        if self._config.load_mode == "auto":
            self._layer_wise = self._choose_load_path(layers) == "layer_wise"

    @property
    def load_mode(self) -> str:
        """The load mode in force (`auto` resolved once the KV cache is registered)."""
        if self._config.load_mode == "auto" and self._pool is not None:
            return "layer_wise" if self._layer_wise else "same_step"
        return self._config.load_mode

    def _choose_load_path(self, layers: Mapping[int, list[LayerBytes]]) -> str:
        """`auto`: time both same-step paths (where both exist), agree on rank 0's choice
        and log it once (rank 0)."""
        if self._mover is None:
            rates = LoadRates(
                None,
                None,
                note="layer_wise needs a CUDA KV cache and a page-locked L1; "
                "this worker copies synchronously",
                same_step_label="synchronous copies",
            )
        elif any(not group.is_attention for group in self._layout.groups):
            rates = LoadRates(
                None, None, note="this model has state groups: it loads async in every mode"
            )
        else:
            assert self._pool is not None
            widths = {group_id: sum(x.nbytes for x in group) for group_id, group in layers.items()}
            label = "copy engine"
            if self._config.copy_path == "direct":
                label = "direct kernel"
            elif any(width != self._pool.shape[1] for width in widths.values()):
                label = "staged, rows by kernel"  # groups share a slot: rows are strided
            rates = time_load_paths(
                self._mover,
                self._pool,
                widths,
                {group_id: len(group) for group_id, group in layers.items()},
                self._layout.num_gpu_blocks,
                label,
            )
        choice = self._agree(choose_load_mode(rates))
        if self._rank == 0:
            logger.info("vllm-marconi-offload worker rank 0: %s", auto_line(rates, choice))
        return choice

    def start_loads(self, meta: OffloadMetadata, *, layer_waits: bool = False) -> None:
        """Start this step's loads. `layer_waits`: the forward will call
        `wait_for_layer` before each attention layer it runs (vLLM runs them eagerly)."""
        self._step = meta.step
        self._end_layer_step()
        if self._mover is not None:
            issued = time.perf_counter()
            same_step = [job for job in meta.loads if job.same_step]
            if layer_waits:
                same_step = self._start_layer_loads(same_step)
            whole = same_step + [job for job in meta.loads if not job.same_step]
            per_job = self._start_loads(whole)
            forward = torch.cuda.current_stream()
            for job, events in zip(whole, per_job, strict=True):
                if job.same_step:
                    for event in events:
                        forward.wait_event(event)
                    self._jobs_in_flight.append((job.job_id, events))
                else:
                    self._loads_in_flight.append((job.req_id, events))
            if meta.loads and logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "loads issued at %.3f: %d requests, %.1f ms to issue",
                    time.time(),
                    len(meta.loads),
                    (time.perf_counter() - issued) * 1e3,
                )
            return
        for job in meta.loads:
            self._run(job, load=True)
            if job.same_step:
                self._finished_jobs[job.job_id] += 1
            else:
                self._finished_loads.add(job.req_id)

    def wait_for_layer(self, name: str) -> None:
        """The forward is about to run attention layer `name`: make it wait for the
        layer's same-step load, if one is in flight."""
        if not self._layer_wise:
            return
        event = self._layer_waits.called(name)
        if event is not None:
            torch.cuda.current_stream().wait_event(event)

    def _end_layer_step(self) -> None:
        """Close the last step's layer waits (learning the forward's layer order from the
        first step that made any); a layer the forward skipped is waited for now."""
        learned = self._layer_waits.learned
        missed = self._layer_waits.end_step()
        if self._layer_wise and not learned and self._layer_waits.learned:
            logger.info(
                "vllm-marconi-offload worker rank %d: load_mode=layer_wise: the forward waits "
                "for %d of %d layers one by one; %s",
                self._rank,
                *self._layer_waits.waiting_layers(),
                self._describe_layer_groups(),
            )
        if missed:
            logger.warning(
                "vllm-marconi-offload worker rank %d: the forward did not wait for %d loaded "
                "layers; later kernels wait for them now",
                self._rank,
                len(missed),
            )
            forward = torch.cuda.current_stream()
            for event in missed:
                forward.wait_event(event)

    def _start_layer_loads(self, jobs: list[TransferJob]) -> list[TransferJob]:
        """Issue same-step `jobs` layer by layer if every group they touch can (its layer
        order is known and the mover moves single layers); return the jobs left to load
        whole (all or none). Issued jobs are in flight until their last layer lands."""
        if not jobs or not self._layer_wise:
            return jobs
        assert self._mover is not None
        assert self._pool is not None
        grouped = _by_group(jobs)
        orders = {group_id: self._layer_order(group_id) for group_id in grouped}
        if any(order is None for order in orders.values()):
            return jobs
        last: list[torch.cuda.Event] = []
        for group_id, (blocks, slots, _) in grouped.items():
            order = orders[group_id]
            assert order is not None
            events = self._mover.load_layers(group_id, slots, blocks, self._pool, order)
            self._layer_waits.expect(group_id, order, events)
            last.append(events[-1])
        self._jobs_in_flight += [(job.job_id, last) for job in jobs]
        return []

    def _layer_order(self, group_id: int) -> list[int] | None:
        """The order in which a load of this group lands layer by layer, or None if it
        cannot (the forward's order is not known for all its layers, or the mover cannot
        move single layers)."""
        if self._mover is None or not self._mover.loads_by_layer(group_id):
            return None
        return self._layer_waits.forward_order(group_id)

    def _describe_layer_groups(self) -> str:
        """Which groups' same-step loads land layer by layer, for the log line."""
        if self._mover is None:
            return "loads land whole (this worker copies synchronously)"
        groups = [group.group_id for group in self._layout.groups]
        able = [g for g in groups if self._layer_order(g) is not None]
        if not able:
            return "loads land whole (no group can move layer by layer)"
        return f"same-step loads of KV-cache groups {able} of {groups} land layer by layer"

    def run_stores(self, meta: OffloadMetadata) -> None:
        if self._mover is not None:
            events = self._start_stores(meta.stores)
            self._jobs_in_flight += [(job.job_id, events) for job in meta.stores]
            return
        for job in meta.stores:
            self._run(job, load=False)
            self._finished_jobs[job.job_id] += 1

    def _start_loads(self, jobs: list[TransferJob]) -> list[list[torch.cuda.Event]]:
        """Issue every job's loads as one mover call per group, in job order; each job
        gets the events that complete once its own blocks have landed."""
        assert self._mover is not None
        assert self._pool is not None
        per_job: list[list[torch.cuda.Event]] = [[] for _ in jobs]
        for group_id, (blocks, slots, ends) in _by_group(jobs).items():
            events = self._mover.load(group_id, slots, blocks, self._pool, ends)
            for job_events, event in zip(per_job, events, strict=True):
                job_events.append(event)
        return per_job

    def _start_stores(self, jobs: list[TransferJob]) -> list[torch.cuda.Event]:
        """Issue every job's stores as one mover call per group; the events complete
        when all of them have landed."""
        assert self._mover is not None
        assert self._pool is not None
        return [
            self._mover.store(group_id, blocks, slots, self._pool)
            for group_id, (blocks, slots, _) in _by_group(jobs).items()
        ]

    def _run(self, job: TransferJob, *, load: bool) -> None:
        assert self._copier is not None, "register_kv_caches first"
        for transfer in job.transfers:
            pairs = zip(transfer.slots, transfer.gpu_blocks, strict=True)
            entries = [(slot, transfer.group_id, block) for slot, block in pairs]
            if load:
                self._copier.scatter(entries)
            else:
                self._copier.gather(entries)

    def take_finished_loads(self) -> set[str] | None:
        self._loads_in_flight = _collect(self._loads_in_flight, self._finished_loads.add)
        finished, self._finished_loads = self._finished_loads, set()
        if finished and logger.isEnabledFor(logging.DEBUG):
            logger.debug("loads reported finished at %.3f: %d requests", time.time(), len(finished))
        return finished or None

    def take_report(self) -> WorkerReport | None:
        """Stores and same-step loads finished since the last report and the step just
        run; None if neither is new."""
        self._jobs_in_flight = _collect(self._jobs_in_flight, self._count_job)
        if not self._finished_jobs and self._step == self._reported_step:
            return None
        done, self._finished_jobs = self._finished_jobs, Counter()
        self._reported_step = self._step
        return WorkerReport(done=done, step=self._step)

    def _count_job(self, job_id: int) -> None:
        self._finished_jobs[job_id] += 1

    def drain(self) -> None:
        """Block until every transfer issued so far has completed (they are then reported
        by the next `take_*` call)."""
        if self._mover is not None:
            self._mover.synchronize()

    def shutdown(self) -> None:
        """Finish transfers; remove this rank's L1 file and layout note (L1 is scratch:
        nothing in it is usable without the scheduler's index)."""
        self.drain()
        close = getattr(self._l1, "close", None)
        if close is not None:
            close()
        if self._unpublish is not None:
            self._unpublish()


def _by_group(jobs: list[TransferJob]) -> dict[int, tuple[list[int], list[int], list[int]]]:
    """Per KV-cache group: every job's GPU blocks and slots, concatenated in job order,
    and the running block count at the end of each job."""
    grouped: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for group_id in sorted({t.group_id for job in jobs for t in job.transfers}):
        blocks: list[int] = []
        slots: list[int] = []
        ends: list[int] = []
        for job in jobs:
            for transfer in job.transfers:
                if transfer.group_id == group_id:
                    blocks.extend(transfer.gpu_blocks)
                    slots.extend(transfer.slots)
            ends.append(len(blocks))
        grouped[group_id] = (blocks, slots, ends)
    return grouped


def _describe(mover: CudaBlockMover | None, mode: str) -> str:
    """How this worker copies, for the start-up line."""
    if mover is None:
        return "synchronous"
    if mode == "direct":
        return "direct CUDA (Triton)"
    return "async CUDA" + (" (Triton gather/scatter)" if mover.uses_kernel else "")


def _collect(
    in_flight: list[tuple[_K, list[torch.cuda.Event]]], finished: Callable[[_K], object]
) -> list[tuple[_K, list[torch.cuda.Event]]]:
    """Hand every entry whose events have all completed to `finished`; keep the rest."""
    pending = []
    for key, events in in_flight:
        if all(event.query() for event in events):
            finished(key)
        else:
            pending.append((key, events))
    return pending
