"""A load ticket says which promotions may have been served from the page cache.

A caller timing promotions to learn the disk's read rate (vllm-marconi-offload's cost
model) must leave those out: a block written a moment before reads at memory speed from a
buffered L2 file, whatever the disk does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import MakeConfig, key
from kvpool_mmap import LoadStatus, Tier, TieredStore
from test_store import put_chain, settle

Factory = Callable[..., TieredStore]


def promote(s: TieredStore, ids: list[int]) -> tuple[int, float]:
    """Load blocks that are in L2 only; (cached_promotions, promotion_seconds)."""
    assert s.lookup([key(i) for i in ids]) == [Tier.L2] * len(ids)
    ticket = s.begin_load([key(i) for i in ids])
    assert s.wait_load(ticket, 10) is LoadStatus.READY
    s.end_load(ticket)
    return ticket.cached_promotions, ticket.promotion_seconds


def push_out_of_l1(s: TieredStore, first: int) -> None:
    """Fill the 4-slot L1 with four new blocks (whose written-through victims are dropped)."""
    assert put_chain(s, list(range(first, first + 4))) == 4
    settle(s)


def test_buffered_l2_reports_blocks_still_in_the_page_cache(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    s = store_factory(make_config(l1_slots=4, direct_io="off", l2_fsync="never"))
    put_chain(s, [0, 1, 2, 3])
    settle(s)  # written through: their pages are in the page cache
    push_out_of_l1(s, 10)
    cached, seconds = promote(s, [0, 1])
    assert cached == 2
    assert seconds > 0
    push_out_of_l1(s, 20)
    s.flush()  # sync + drop the cache: every page touched so far is gone
    assert promote(s, [0, 1])[0] == 0  # read from the disk (and cached again by that read)
    assert promote(s, [2, 3])[0] == 0
    push_out_of_l1(s, 30)
    assert promote(s, [0, 1])[0] == 2  # read moments ago, not dropped since


def test_direct_io_never_reports_cached_reads(
    make_config: MakeConfig, store_factory: Factory
) -> None:
    try:
        s = store_factory(make_config(l1_slots=4, direct_io="on", l2_fsync="never"))
    except ValueError as exc:  # LayoutMismatchError: this filesystem refuses O_DIRECT
        pytest.skip(f"no O_DIRECT here: {exc}")
    put_chain(s, [0, 1, 2, 3])
    settle(s)
    push_out_of_l1(s, 10)
    assert promote(s, [0, 1, 2, 3])[0] == 0
