"""The plugins' block copier on CPU tensors: every byte of every block, in both directions,
across buffer passes, hybrid groups, rows left out of a load and scattered rows."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm_kv_identity.block_copy import BlockCopier  # noqa: E402

# torch: skipped in this package's own session, run in the integration sessions

PAGE = [96, 96, 160]  # tensors 0 and 1 form group 0, tensor 2 group 1
GROUPS = [[(0, 96), (1, 96)], [(2, 160)]]
ROW = 192  # the widest group


def _cache(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-128, 128, (40, p), dtype=torch.int8, generator=gen) for p in PAGE]


def _expected_row(cache: list[torch.Tensor], group: int, block: int) -> torch.Tensor:
    return torch.cat([cache[t][block, :size] for t, size in GROUPS[group]])


@pytest.mark.parametrize("buffer_rows", [1, 3, 64])
def test_gather_then_scatter_moves_every_byte(buffer_rows: int) -> None:
    source, target = _cache(1), _cache(2)
    host = torch.zeros((7, ROW), dtype=torch.int8)
    blocks = [(0, 5), (1, 33), (0, 0), (1, 2), (0, 39), (0, 17), (1, 17)]
    copier = BlockCopier(source, GROUPS, host, buffer_bytes=buffer_rows * ROW)
    copier.gather([(row, group, block) for row, (group, block) in enumerate(blocks)])
    for row, (group, block) in enumerate(blocks):
        want = _expected_row(source, group, block)
        assert torch.equal(host[row, : want.numel()], want), (row, group, block)

    loaded = [(row, group, 30 - row) for row, (group, _) in enumerate(blocks) if row != 3]
    untouched = [t.clone() for t in target]
    BlockCopier(target, GROUPS, host, buffer_bytes=buffer_rows * ROW).scatter(loaded)
    written = {(group, block) for _, group, block in loaded}
    for row, group, block in loaded:
        assert torch.equal(_expected_row(target, group, block), _expected_row(source, *blocks[row]))
    for tidx, tensor in enumerate(target):  # nothing else changed, row 3's block included
        group = 0 if tidx < 2 else 1
        for block in range(40):
            if (group, block) not in written:
                assert torch.equal(tensor[block], untouched[tidx][block]), (tidx, block)


@pytest.mark.parametrize("buffer_rows", [1, 2, 64])
def test_scattered_rows_leave_the_rows_between_untouched(buffer_rows: int) -> None:
    source, target = _cache(3), _cache(4)
    host = torch.randint(-128, 128, (12, ROW + 8), dtype=torch.int8)  # rows wider than a block
    before = host.clone()
    entries = [(9, 0, 4), (2, 1, 11), (5, 0, 30), (6, 1, 0)]
    copier = BlockCopier(source, GROUPS, host, buffer_bytes=buffer_rows * ROW)
    copier.gather(entries)
    for row, group, block in entries:
        want = _expected_row(source, group, block)
        assert torch.equal(host[row, : want.numel()], want), (row, group, block)
    named = {row for row, _, _ in entries}
    for row in range(12):
        if row not in named:
            assert torch.equal(host[row], before[row]), row
        assert torch.equal(host[row, ROW:], before[row, ROW:]), row  # past the widest block

    BlockCopier(target, GROUPS, host, buffer_bytes=buffer_rows * ROW).scatter(entries)
    for _, group, block in entries:
        assert torch.equal(_expected_row(target, group, block), _expected_row(source, group, block))
