"""vLLM's KV cache tensors as bytes per block, for copies between them and L1 slots
(worker side).

Each layer's tensor is viewed as `[num_blocks, block_bytes]` bytes, so a batch of blocks
moves with one gather and one scatter per layer, whatever the attention backend's element
layout: by `CudaBlockMover` on CUDA, else by the block copier both plugins share
(`vllm_kv_identity.block_copy`), never one copy per block per layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from vllm_kv_identity.block_copy import BlockCopier

from .layout import LayoutError, SlotLayout


@dataclass(frozen=True)
class LayerBytes:
    """One layer's KV cache as bytes per block, and where it lands in a slot."""

    view: torch.Tensor  # uint8 [num_gpu_blocks, nbytes]
    offset: int
    nbytes: int


def block_bytes_view(tensor: torch.Tensor, num_blocks: int, nbytes: int) -> torch.Tensor:
    """View a layer's KV tensor as uint8 `[num_blocks, nbytes]` without copying.

    The first dimension must index blocks (or kernel blocks, several per vLLM block), and
    each block's bytes must be contiguous: true for every block-major layout vLLM uses.
    """
    if tensor.dim() == 0 or tensor.shape[0] % num_blocks:
        raise LayoutError(
            f"KV tensor of shape {tuple(tensor.shape)} does not start with a block dimension "
            f"divisible by num_blocks={num_blocks}"
        )
    per_block = tensor.shape[0] // num_blocks
    if not _dense(tensor[0]):
        raise LayoutError(
            f"KV tensor of shape {tuple(tensor.shape)} and stride {tensor.stride()} is not "
            "block-major; set VLLM_KV_CACHE_LAYOUT to a layout whose outer dimension is the "
            "block (e.g. LBHNC or LBNHC)"
        )
    item = tensor.element_size()
    block_stride = tensor.stride(0) * per_block * item
    if per_block > 1 and tensor.stride(0) != tensor[0].numel():
        raise LayoutError("kernel blocks of one vLLM block are not adjacent in memory")
    if nbytes > block_stride:
        raise LayoutError(
            f"layer page of {nbytes} bytes exceeds its block stride of {block_stride} bytes"
        )
    storage = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    storage.set_(tensor.untyped_storage())
    return storage.as_strided(
        (num_blocks, nbytes), (block_stride, 1), tensor.storage_offset() * item
    )


def _dense(block: torch.Tensor) -> bool:
    """True if `block`'s elements fill one gap-free range of memory in some dimension order
    (e.g. vLLM 0.26 FlashAttention's NHD layout: logical (H, N, 2D), physical (N, H, 2D))."""
    expected = 1
    for size, stride in sorted(zip(block.shape, block.stride(), strict=True), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def layer_views(
    layout: SlotLayout, kv_caches: Mapping[str, torch.Tensor]
) -> dict[int, list[LayerBytes]]:
    """Each KV-cache group's layers as bytes per block, by group id, in slot order."""
    views: dict[int, list[LayerBytes]] = {}
    for group in layout.groups:
        views[group.group_id] = []
        for layer in group.layers:
            tensor = kv_caches.get(layer.name)
            if tensor is None:
                raise LayoutError(f"vLLM registered no KV cache tensor for layer {layer.name}")
            view = block_bytes_view(tensor, layout.num_gpu_blocks, layer.nbytes)
            views[group.group_id].append(
                LayerBytes(view=view, offset=layer.offset, nbytes=layer.nbytes)
            )
    return views


def slot_copier(layers: Mapping[int, Sequence[LayerBytes]], pool: torch.Tensor) -> BlockCopier:
    """The shared block copier between these layer views and the rows (slots) of `pool`
    (uint8 `[slots, stride]`): its `(row, group, block)` entries are `(slot, group id, GPU
    block)`. Each group's layers lie end to end in a slot, in order (`SlotLayout`)."""
    tensors: list[torch.Tensor] = []
    groups: list[list[tuple[int, int]]] = []
    for group_id in range(len(layers)):
        groups.append(
            [(len(tensors) + i, layer.nbytes) for i, layer in enumerate(layers[group_id])]
        )
        tensors += [layer.view for layer in layers[group_id]]
    return BlockCopier(tensors, groups, pool)


def physical_layout(layout: SlotLayout, kv_caches: Mapping[str, torch.Tensor]) -> str:
    """How each layer's block bytes are arranged in memory, as text.

    Slots hold raw bytes, so two engines whose KV tensors have the same page size but a
    different element order (NHD vs HND, K/V split or interleaved: another attention
    backend, or another vLLM) must never share stored blocks. Everything that does not
    depend on the number of GPU blocks goes in: dtype, blocks per vLLM block, the block's
    shape and the strides.
    """
    parts = []
    for group in layout.groups:
        for layer in group.layers:
            tensor = kv_caches[layer.name]
            per_block = tensor.shape[0] // layout.num_gpu_blocks
            parts.append(
                f"{layer.name}:{tensor.dtype}:{per_block}:"
                f"{tuple(tensor.shape[1:])}:{tuple(tensor.stride())}"
            )
    return "\n".join(parts)
