"""Batched block copies round-trip bytes exactly for every layout vLLM hands a connector."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm  # the worker's data path: needs torch, run with vLLM
torch = pytest.importorskip("torch")

from vllm_marconi_offload.block_copy import (  # noqa: E402
    block_bytes_view,
    layer_views,
    physical_layout,
    slot_copier,
)
from vllm_marconi_offload.cuda_mover import slot_runs  # noqa: E402
from vllm_marconi_offload.layout import LayoutError, SlotLayout  # noqa: E402

NUM_BLOCKS = 16


def make_layout(pages: dict[str, int], groups: list[list[str]]) -> SlotLayout:
    kv_groups = [
        SimpleNamespace(
            layer_names=names,
            kv_cache_spec=SimpleNamespace(
                page_size_bytes=pages[names[0]], block_size=32, head_size=64
            ),
        )
        for names in groups
    ]
    return SlotLayout.from_kv_cache_config(
        SimpleNamespace(kv_cache_groups=kv_groups, num_blocks=NUM_BLOCKS)
    )


def random_bytes(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8)


def test_cpu_backend_layout_round_trips() -> None:
    # CPU attention: [num_blocks, heads, block_size, 2 * head_size] bf16, one tensor per layer.
    layers = {
        f"l{i}": random_bytes(NUM_BLOCKS, 2, 32, 128 * 2).view(torch.bfloat16) for i in range(3)
    }
    page = 2 * 32 * 128 * 2
    layout = make_layout(dict.fromkeys(layers, page), [list(layers)])
    originals = {name: t.clone() for name, t in layers.items()}
    pool = torch.zeros(8, layout.stride, dtype=torch.uint8)
    copier = slot_copier(layer_views(layout, layers), pool)
    copier.gather([(5, 0, 3), (0, 0, 7), (2, 0, 11)])
    for tensor in layers.values():
        tensor.zero_()
    copier.scatter([(5, 0, 1), (0, 0, 2), (2, 0, 3)])
    for name, tensor in layers.items():
        got, want = tensor.view(torch.uint8), originals[name].view(torch.uint8)
        assert torch.equal(got[1], want[3])
        assert torch.equal(got[2], want[7])
        assert torch.equal(got[3], want[11])
        assert not got[0].any()  # untouched blocks stay untouched


def test_shared_buffer_with_interleaved_layers() -> None:
    # vLLM >= 0.29 may place all layers of one block next to each other (block-major over
    # layers): each layer is a strided view into one int8 buffer.
    page = 4096
    buffer = random_bytes(NUM_BLOCKS, 2, page)
    layers = {f"l{i}": buffer[:, i, :].view(NUM_BLOCKS, 4, 32, 32) for i in range(2)}
    view = block_bytes_view(layers["l1"], NUM_BLOCKS, page)
    assert torch.equal(view[5], buffer[5, 1])
    layout = make_layout(dict.fromkeys(layers, page), [["l0"], ["l1"]])
    pool = torch.zeros(4, layout.stride, dtype=torch.uint8)
    copier = slot_copier(layer_views(layout, layers), pool)
    copier.gather([(3, 1, 9)])
    assert torch.equal(pool[3], buffer[9, 1])
    assert layout.stride == page  # one layer per group: the widest group decides


def test_padded_state_pages_copy_whole_page() -> None:
    # Mamba pages padded to the attention page: an int8 [B, 1, 1, state] view with a
    # larger block stride. The page size vLLM reports is the padded one.
    padded, state = 8192, 5000
    backing = random_bytes(NUM_BLOCKS, padded)
    tensor = backing[:, :state].view(NUM_BLOCKS, 1, 1, state)
    view = block_bytes_view(tensor, NUM_BLOCKS, padded)
    assert torch.equal(view[4], backing[4])


def test_kernel_blocks_per_block() -> None:
    # The first dimension may count kernel blocks, several per vLLM block.
    tensor = random_bytes(NUM_BLOCKS * 2, 8, 64)
    view = block_bytes_view(tensor, NUM_BLOCKS, 2 * 8 * 64)
    assert torch.equal(view[3], tensor[6:8].reshape(-1))


def test_non_block_major_layout_is_refused() -> None:
    tensor = random_bytes(4, NUM_BLOCKS, 64).transpose(0, 1)  # heads outside blocks
    with pytest.raises(LayoutError, match="not block-major"):
        block_bytes_view(tensor, NUM_BLOCKS, 4 * 64)


def test_missing_layer_is_an_error() -> None:
    layout = make_layout({"l0": 64}, [["l0"]])
    with pytest.raises(LayoutError, match="no KV cache tensor for layer l0"):
        layer_views(layout, {})


def test_permuted_dense_block_layout_is_accepted() -> None:
    # vLLM 0.26 FlashAttention with the NHD layout: logical (B, H, N, 2D), physical
    # (B, N, H, 2D). A block's bytes are still one gap-free range.
    physical = random_bytes(NUM_BLOCKS, 32, 4, 64 * 2).view(torch.bfloat16)
    logical = physical.permute(0, 2, 1, 3)
    page = 32 * 4 * 64 * 2  # bytes: 64 bf16 per row
    view = block_bytes_view(logical, NUM_BLOCKS, page)
    assert torch.equal(view[6], physical[6].reshape(-1).view(torch.uint8))


def test_physical_layout_tells_element_orders_apart() -> None:
    """Same logical shape and page size, bytes arranged HND vs NHD: another signature, so
    blocks stored under one are never loaded under the other. The block count is not in it."""
    page = 32 * 4 * 64 * 2
    layout = make_layout({"l0": page}, [["l0"]])
    hnd = random_bytes(NUM_BLOCKS, 4, 32, 64 * 2).view(torch.bfloat16)
    nhd = random_bytes(NUM_BLOCKS, 32, 4, 64 * 2).view(torch.bfloat16).permute(0, 2, 1, 3)
    assert hnd.shape == nhd.shape
    assert physical_layout(layout, {"l0": hnd}) != physical_layout(layout, {"l0": nhd})
    bigger = random_bytes(2 * NUM_BLOCKS, 4, 32, 64 * 2).view(torch.bfloat16)
    bigger_layout = SlotLayout(groups=layout.groups, num_gpu_blocks=2 * NUM_BLOCKS)
    assert physical_layout(bigger_layout, {"l0": bigger}) == physical_layout(layout, {"l0": hnd})


def test_block_with_gaps_is_rejected() -> None:
    sliced = random_bytes(NUM_BLOCKS, 4, 64)[:, :, :32]
    with pytest.raises(LayoutError):
        block_bytes_view(sliced, NUM_BLOCKS, 4 * 32)


def test_slot_runs_cover_every_slot_once() -> None:
    assert list(slot_runs([4, 5, 6, 9, 2, 3])) == [(0, 4, 3), (3, 9, 1), (4, 2, 2)]
    assert list(slot_runs([7])) == [(0, 7, 1)]
