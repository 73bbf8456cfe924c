"""Moving whole KV blocks between vLLM's per-layer cache tensors and host rows, for both
plugins: the row format of stored KV.

A block of KV-cache group `g` is stored in one host row as its pages of every tensor of
`g`, laid end to end in the group's order; the rest of the row is unused. `BlockCopier`
fills rows from blocks (`gather`) and blocks from rows (`scatter`) with a few large
operations per call instead of one small copy per block and tensor: blocks pass through a
bounded buffer on the cache's device (one indexed copy per tensor and group, one host
transfer per buffer-full: a slice where the rows are consecutive, indexed otherwise). On
CUDA that runs on the copier's own stream, ordered after the work the engine had queued
when the job was submitted (`mark`).

Imports torch (never vLLM) and is not imported by `vllm_kv_identity` itself: only the
plugins' data paths, which run next to torch, use it. A copier belongs to one thread; its
methods return once every byte has arrived.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

__all__ = ["DEVICE_BUFFER_BYTES", "BlockCopier", "mark"]

DEVICE_BUFFER_BYTES = 32 << 20  # per copier, on the cache's device
Entry = tuple[int, int, int]  # (host row, group, block id)


def mark(device: torch.device) -> torch.cuda.Event | None:
    """An event after the work queued so far on `device`'s current stream (None on CPU).

    Call it in the engine thread when a job is submitted and pass it to `gather`/`scatter`,
    so the copy reads blocks only after the forward that wrote them, and writes blocks only
    after the work that last read them.
    """
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class BlockCopier:
    """Copies blocks of `tensors` (each `[num_blocks, >= page bytes]` of one-byte elements,
    any strides) to and from the rows of `host` (`[rows, row_bytes]`, one-byte elements;
    page-locked on CUDA for asynchronous transfers).

    `groups[g]` lists `(tensor index, page bytes)` of KV-cache group `g`: a group-`g` block
    occupies the first `sum(page bytes)` bytes of its row, tensor by tensor.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], groups: Sequence[Sequence[tuple[int, int]]],
                 host: torch.Tensor, buffer_bytes: int = DEVICE_BUFFER_BYTES) -> None:  # fmt: skip
        self._tensors = [tensor.view(host.dtype) for tensor in tensors]
        self._groups = [list(group) for group in groups]
        self._host = host
        self._device = self._tensors[0].device
        width = max(sum(size for _, size in group) for group in self._groups)
        if width > host.shape[1]:
            raise ValueError(
                f"host rows of {host.shape[1]} bytes are narrower than a {width}-byte block"
            )
        self._rows_per_pass = max(1, min(int(host.shape[0]), buffer_bytes // width))
        self._buffer = torch.empty(
            (self._rows_per_pass, width), dtype=host.dtype, device=self._device
        )
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None

    def gather(self, entries: Sequence[Entry], after: torch.cuda.Event | None = None) -> None:
        """Host row `row` := block `block` of group `group`, for every `(row, group, block)`.

        Rows not named keep their bytes; a named row's bytes past its group's block and
        within the widest group's may change."""
        width = self._buffer.shape[1]
        with self._on_stream(after):
            for rows, part in self._passes(entries):
                n = len(part)
                self._copy(part, to_buffer=True)
                staged = self._buffer[:n]
                if isinstance(rows, slice):
                    self._host[rows, :width].copy_(staged, non_blocking=True)
                else:
                    self._host[:, :width].index_copy_(0, rows, staged.to(self._host.device))
                self._wait()  # the next pass reuses the buffer

    def scatter(self, entries: Sequence[Entry], after: torch.cuda.Event | None = None) -> None:
        """Block `block` of group `group` := host row `row`, for every `(row, group, block)`."""
        width = self._buffer.shape[1]
        with self._on_stream(after):
            for rows, part in self._passes(entries):
                n = len(part)
                source = self._host[rows, :width] if isinstance(rows, slice) else (
                    self._host[:, :width].index_select(0, rows)
                )  # fmt: skip
                self._buffer[:n].copy_(source, non_blocking=True)
                self._copy(part, to_buffer=False)
                self._wait()

    def _on_stream(self, after: torch.cuda.Event | None) -> AbstractContextManager[Any]:
        if self._stream is None:
            return nullcontext()
        if after is None:  # order after what the calling thread's stream has queued
            after = mark(self._device)
        if after is not None:
            self._stream.wait_event(after)
        context: AbstractContextManager[Any] = torch.cuda.stream(self._stream)
        return context

    def _wait(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _passes(
        self, entries: Sequence[Entry]
    ) -> Iterator[tuple[slice | torch.Tensor, list[Entry]]]:
        """Entries by host row, a buffer-full at a time: the pass's host rows (a slice
        where consecutive, else their indices on the host's device) and its entries, each
        with its buffer row in place of its host row."""
        ordered = sorted(entries)
        for start in range(0, len(ordered), self._rows_per_pass):
            chunk = ordered[start : start + self._rows_per_pass]
            first, last = chunk[0][0], chunk[-1][0]
            rows: slice | torch.Tensor = slice(first, last + 1)
            if last - first + 1 != len(chunk):
                rows = torch.tensor([row for row, _, _ in chunk], device=self._host.device)
            yield rows, [(i, group, block) for i, (_, group, block) in enumerate(chunk)]

    def _copy(self, entries: Sequence[Entry], *, to_buffer: bool) -> None:
        """One indexed copy per tensor and group between the device buffer and the blocks."""
        by_group: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for row, group, block in entries:
            by_group[group][0].append(row)
            by_group[group][1].append(block)
        for group, (rows, blocks) in by_group.items():
            row_idx = torch.tensor(rows, dtype=torch.long).to(self._device, non_blocking=True)
            block_idx = torch.tensor(blocks, dtype=torch.long).to(self._device, non_blocking=True)
            offset = 0
            for tidx, size in self._groups[group]:
                tensor = self._tensors[tidx]
                if to_buffer:
                    self._buffer[row_idx, offset : offset + size] = tensor[block_idx, :size]
                else:
                    tensor[block_idx, :size] = self._buffer[row_idx, offset : offset + size]
                offset += size
