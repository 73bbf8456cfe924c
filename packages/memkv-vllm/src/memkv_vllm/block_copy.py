"""Moving whole KV blocks between vLLM's per-layer cache tensors and host rows.

A direct-mode value is one block's pages of every tensor of its KV cache group, laid end to
end in one host row. `BlockCopier` fills rows from blocks (`gather`) and blocks from rows
(`scatter`) with a few large operations per call instead of one small copy per block and
layer: blocks pass through a small buffer on the cache's device (one indexed copy per
tensor and group, one host transfer per buffer-full). On CUDA that runs on the copier's own
stream, between page-locked rows and the GPU, ordered after the work the engine had queued
when the job was submitted (`mark`).

A copier belongs to one thread; its methods return once every byte has arrived.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["BlockCopier", "mark"]

DEVICE_BUFFER_BYTES = 32 << 20  # per copier, on the cache's device


def mark(device: Any) -> Any:
    """An event after the work queued so far on `device`'s current stream (None on CPU).

    Call it in the engine thread when a job is submitted and pass it to `gather`/`scatter`,
    so the copy reads blocks only after the forward that wrote them, and writes blocks only
    after the work that last read them.
    """
    if device.type != "cuda":
        return None
    import torch

    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class BlockCopier:
    """Copies blocks of `tensors` (each `[num_blocks, page_bytes]` int8) to and from the rows
    of `host` (`[rows, row_bytes]` int8, page-locked on CUDA).

    `groups[g]` lists `(tensor index, page bytes)` of KV cache group `g`: a group-`g` block
    occupies the first `sum(page bytes)` bytes of its row, tensor by tensor.
    """

    def __init__(self, tensors: Sequence[Any], groups: Sequence[Sequence[tuple[int, int]]],
                 host: Any, buffer_bytes: int = DEVICE_BUFFER_BYTES) -> None:  # fmt: skip
        import torch

        self._tensors = list(tensors)
        self._groups = [list(g) for g in groups]
        self._host = host
        self._device = self._tensors[0].device
        rows, row_bytes = int(host.shape[0]), int(host.shape[1])
        self._rows_per_pass = max(1, min(rows, buffer_bytes // row_bytes))
        self._buffer = torch.empty(
            (self._rows_per_pass, row_bytes), dtype=torch.int8, device=self._device
        )
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None

    def gather(self, blocks: Sequence[tuple[int, int]], after: Any = None) -> None:
        """Host row `i` := block `blocks[i] = (group, block id)`, for every `i`."""
        entries = [(i, group, block) for i, (group, block) in enumerate(blocks)]
        with self._on_stream(after):
            for first, part in self._passes(entries):
                self._copy(part, to_buffer=True)
                n = len(part)
                self._host[first : first + n].copy_(self._buffer[:n], non_blocking=True)
                self._wait()  # the next pass reuses the buffer

    def scatter(self, entries: Sequence[tuple[int, int, int]], after: Any = None) -> None:
        """Block `block` of group `group` := host row `row`, for every `(row, group, block)`."""
        with self._on_stream(after):
            for first, part in self._passes(entries):
                n = part[-1][0] + 1
                self._buffer[:n].copy_(self._host[first : first + n], non_blocking=True)
                self._copy(part, to_buffer=False)
                self._wait()

    def _on_stream(self, after: Any) -> AbstractContextManager[Any]:
        if self._stream is None:
            return nullcontext()
        import torch

        if after is not None:
            self._stream.wait_event(after)
        context: AbstractContextManager[Any] = torch.cuda.stream(self._stream)
        return context

    def _wait(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _passes(
        self, entries: Sequence[tuple[int, int, int]]
    ) -> Iterator[tuple[int, list[tuple[int, int, int]]]]:
        """Entries by row, in runs whose rows fit the device buffer; each run's first host
        row and its entries with rows relative to it."""
        ordered = sorted(entries)
        i = 0
        while i < len(ordered):
            first = ordered[i][0]
            part = []
            while i < len(ordered) and ordered[i][0] - first < self._rows_per_pass:
                row, group, block = ordered[i]
                part.append((row - first, group, block))
                i += 1
            yield first, part

    def _copy(self, entries: Sequence[tuple[int, int, int]], *, to_buffer: bool) -> None:
        """One indexed copy per tensor and group between the device buffer and the blocks."""
        import torch

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
