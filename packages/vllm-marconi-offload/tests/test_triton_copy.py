"""The Triton block-copy kernel moves exactly the bytes of every layer, in both directions,
with one program per work item or with a few programs that loop over them (over PCIe).

The kernel runs under Triton's CPU interpreter (`TRITON_INTERPRET=1`, in a child process so
that no other test sees it) on CPU tensors laid out as vLLM lays out GPU KV caches.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm  # needs torch and Triton
pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from vllm_marconi_offload.block_copy import LayerBytes, block_bytes_view
    from vllm_marconi_offload.triton_copy import GroupCopyPlan

    NUM_BLOCKS, LAYERS = 12, 3
    torch.manual_seed(0)

    def layers_of(tensors, page):
        return [
            LayerBytes(block_bytes_view(t, NUM_BLOCKS, page), offset=i * page, nbytes=page)
            for i, t in enumerate(tensors)
        ]

    def check(tensors, page, row_width, programs=None):
        layers = layers_of(tensors, page)
        plan = GroupCopyPlan.build(layers, torch.device("cpu"))
        assert plan is not None
        blocks, rows = [7, 0, 11, 3], [5, 2, 0, 6]
        original = [layer.view.clone() for layer in layers]
        pool = torch.zeros(8, row_width, dtype=torch.uint8)
        plan.copy(pool, torch.tensor(rows), torch.tensor(blocks), to_rows=True, programs=programs)
        for layer, want in zip(layers, original):
            for block, row in zip(blocks, rows):
                got = pool[row, layer.offset : layer.offset + page]
                assert torch.equal(got, want[block]), (block, row)
        assert not pool[[1, 3, 4, 7]].any(), "rows outside the batch were written"
        for layer in layers:
            layer.view.zero_()
        plan.copy(
            pool, torch.tensor(rows), torch.tensor([1, 2, 9, 10]), to_rows=False, programs=programs
        )
        for layer, want in zip(layers, original):
            for block, source in zip([1, 2, 9, 10], blocks):
                assert torch.equal(layer.view[block], want[source])
            assert not layer.view[[0, 3, 4, 5, 6, 7, 8, 11]].any(), "other blocks written"

    # One tensor per layer, block-major, a page that is not a multiple of the tile.
    page = 2 * 16 * 2 * 64 * 2
    for programs in (None, 1, 5):  # one program per item; few programs looping (over PCIe)
        tensors = [torch.randint(0, 256, (NUM_BLOCKS, page), dtype=torch.uint8)
                   for _ in range(LAYERS)]
        check(tensors, page, LAYERS * page + 64, programs)
    # All layers of a block side by side in one buffer (strided views, vLLM >= 0.29).
    page = 8192
    shared = torch.randint(0, 256, (NUM_BLOCKS, LAYERS, page), dtype=torch.uint8)
    check([shared[:, i] for i in range(LAYERS)], page, LAYERS * page)
    # One layer of each row (a layer-wise load): only that layer's blocks change.
    rows = torch.randint(0, 256, (8, LAYERS * page), dtype=torch.uint8)
    layers = layers_of([shared[:, i] for i in range(LAYERS)], page)
    before = shared.clone()
    single = GroupCopyPlan.build([layers[1]], torch.device("cpu"))
    single.copy(rows, torch.tensor([6, 2]), torch.tensor([3, 9]), to_rows=False, programs=2)
    assert torch.equal(shared[3, 1], rows[6, page : 2 * page])
    assert torch.equal(shared[9, 1], rows[2, page : 2 * page])
    before[[3, 9], 1] = shared[[3, 9], 1]
    assert torch.equal(shared, before), "another layer or block was written"
    # Whole staged rows into scattered, wider L1 rows (how a store crosses PCIe by kernel).
    staged = torch.randint(0, 256, (4, 3 * page), dtype=torch.uint8)
    whole = [LayerBytes(staged, offset=0, nbytes=3 * page)]
    plan = GroupCopyPlan.build(whole, torch.device("cpu"))
    pool = torch.zeros(9, 3 * page + 512, dtype=torch.uint8)
    plan.copy(pool, torch.tensor([8, 1, 4, 0]), torch.arange(4), to_rows=True, programs=3)
    for position, row in enumerate([8, 1, 4, 0]):
        assert torch.equal(pool[row, : 3 * page], staged[position])
        assert not pool[row, 3 * page :].any()
    # Pages of different sizes, or not whole words: no plan (the caller copies per layer).
    odd = [torch.zeros(NUM_BLOCKS, 4100, dtype=torch.uint8) for _ in range(2)]
    assert GroupCopyPlan.build(layers_of(odd, 4100), torch.device("cpu")) is None
    print("KERNEL-OK")
    """
)


def test_kernel_round_trips_every_layer_of_scattered_blocks() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert "KERNEL-OK" in done.stdout, done.stdout + done.stderr
