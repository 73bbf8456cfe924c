"""One Triton kernel that moves a batch of blocks of every layer of a KV-cache group.

A transfer between the KV cache and rows (a GPU staging buffer, or page-locked L1 rows the
GPU reads and writes over PCIe) is one launch, whatever the number of layers and blocks:
its work items are (block i, layer l, tile t), each 8 KiB of block i's bytes in layer l.
The per-layer loop of torch copies it replaces cost one launch per layer per chunk, enough
launches for a long prompt to fill CUDA's launch queue and block the engine's main thread
for the whole transfer.

By default each program copies one item. Over PCIe, `programs` caps the launch at that
many programs, each looping over every `programs`-th item: a program waits microseconds
for every tile that crosses the link, and one per item would fill every SM for as long as
the link is busy, stalling the forward pass (and a store's gather) that runs beside a load.

The kernel works in 8-byte words: every layer's page, offset and block stride, and the row
stride, must be multiples of 8 bytes (`GroupCopyPlan.build` returns None otherwise, and
the caller falls back to torch copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .block_copy import LayerBytes

try:  # Triton ships with CUDA builds of torch; CPU-only installs may lack it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is missing
    triton = None

WORD = 8  # bytes per element the kernel moves
TILE = 1024  # words per program: 8 KiB


def available() -> bool:
    """True if Triton can be imported here."""
    return triton is not None


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """A one-word int64 view of `tensor`'s first bytes: the kernel's base pointer.

    It shares `tensor`'s storage, so it keeps that memory alive and Triton (or its CPU
    interpreter) sees the same address (an empty view would report address 0).
    """
    base = torch.empty(0, dtype=torch.int64, device=tensor.device)
    offset = tensor.storage_offset() * tensor.element_size()
    return base.set_(tensor.untyped_storage(), offset // WORD, (1,), (1,))


if triton is not None:
    # Counts vary per call: one compiled kernel for all (no per-value specialization, which
    # would compile again on the hot path).
    @triton.jit(do_not_specialize=["items", "layer_tiles", "tiles", "programs"])  # type: ignore[misc]
    def _copy_blocks(  # type: ignore[no-untyped-def]  # Triton reads the annotations
        rows,  # int64* base of the rows
        row_ids,  # int64[n]: row of each block
        row_words,  # words between rows
        kv,  # int64* base of layer 0's KV view
        layer_delta,  # int64[L]: layer l's base minus layer 0's, in words
        layer_stride,  # int64[L]: words between blocks of layer l
        layer_offset,  # int64[L]: layer l's offset in a row, in words
        page_words,  # words of one block in one layer
        block_ids,  # int64[n]: KV block of each row
        items,  # n * L * tiles: the work items
        layer_tiles,  # L * tiles: items per block
        tiles,  # tiles per page
        programs,  # programs launched: program p takes items p, p + programs, ...
        to_rows: tl.constexpr,
        tile: tl.constexpr,
    ) -> None:
        item = tl.program_id(0)
        while item < items:
            i = item // layer_tiles
            layer = (item % layer_tiles) // tiles
            words = (item % tiles) * tile + tl.arange(0, tile)
            mask = words < page_words
            row = tl.load(row_ids + i)
            block = tl.load(block_ids + i)
            row_at = rows + row * row_words + tl.load(layer_offset + layer) + words
            kv_at = (
                kv + tl.load(layer_delta + layer) + block * tl.load(layer_stride + layer) + words
            )
            if to_rows:
                tl.store(row_at, tl.load(kv_at, mask=mask), mask=mask)
            else:
                tl.store(kv_at, tl.load(row_at, mask=mask), mask=mask)
            item += programs


@dataclass(frozen=True)
class GroupCopyPlan:
    """The per-layer addresses of one KV-cache group, uploaded once to the device."""

    kv: torch.Tensor  # int64 view at layer 0's first block
    deltas: torch.Tensor  # int64 [L] on the device
    strides: torch.Tensor  # int64 [L]
    offsets: torch.Tensor  # int64 [L]
    page_words: int
    width: int  # bytes of the group in a row

    @staticmethod
    def build(layers: Sequence[LayerBytes], device: torch.device) -> GroupCopyPlan | None:
        """The plan for `layers`, or None if the kernel cannot move them (no Triton, pages
        of different sizes, or anything not a multiple of 8 bytes)."""
        if triton is None or not layers:
            return None
        pages = {layer.nbytes for layer in layers}
        base = layers[0].view.data_ptr()
        values = [
            (layer.view.data_ptr() - base, layer.view.stride(0), layer.offset, layer.nbytes)
            for layer in layers
        ]
        if len(pages) != 1 or any(v % WORD for row in values for v in row) or base % 16:
            return None

        def upload(column: int) -> torch.Tensor:
            words = [row[column] // WORD for row in values]
            return torch.tensor(words, dtype=torch.int64, device=device)

        return GroupCopyPlan(
            kv=_words(layers[0].view),
            deltas=upload(0),
            strides=upload(1),
            offsets=upload(2),
            page_words=pages.pop() // WORD,
            width=sum(layer.nbytes for layer in layers),
        )

    def copy(
        self,
        rows: torch.Tensor,
        row_ids: torch.Tensor,
        block_ids: torch.Tensor,
        *,
        to_rows: bool,
        programs: int | None = None,
    ) -> None:
        """Copy blocks `block_ids` of every layer to (`to_rows`) or from rows `row_ids`
        of `rows` (uint8 [R, >= width], on the device or page-locked host memory) on the
        current stream. The id tensors are int64 on the device, of equal length.
        `programs`: launch at most that many programs (for rows across PCIe)."""
        count = block_ids.shape[0]
        if count == 0:
            return
        if rows.stride(1) != 1 or rows.stride(0) % WORD or rows.data_ptr() % 16:
            raise ValueError("rows must be 16-byte aligned with 8-byte-multiple row strides")
        if programs is not None and programs < 1:
            raise ValueError(f"programs must be at least 1, got {programs}")
        tiles = triton.cdiv(self.page_words, TILE)
        layer_tiles = self.deltas.shape[0] * tiles
        items = count * layer_tiles
        launched = items if programs is None else min(items, programs)
        _copy_blocks[(launched,)](
            _words(rows),
            row_ids,
            rows.stride(0) // WORD,
            self.kv,
            self.deltas,
            self.strides,
            self.offsets,
            self.page_words,
            block_ids,
            items,
            layer_tiles,
            tiles,
            launched,
            to_rows=to_rows,
            tile=TILE,
        )
