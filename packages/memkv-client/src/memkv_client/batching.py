"""Splitting one server's share of a batch into requests (pure; no I/O)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MIN_SPLIT", "split_requests"]

MIN_SPLIT = 8 << 20  #: bytes below which a server's batch is not spread over connections


def split_requests(
    positions: Sequence[int],
    sizes: Sequence[int],
    *,
    max_items: int,
    max_bytes: int,
    connections: int,
    together: Sequence[bytes] | None = None,
) -> list[list[int]]:
    """Split the items at `positions` (sizes indexed by position) into requests.

    Each request holds at most `max_items` items and `max_bytes` of values; a large
    batch is spread over up to `connections` requests of at least `MIN_SPLIT` bytes so
    they run in parallel. With `together` (a key per position, equal keys adjacent), a
    run of equal keys is never split across requests.
    """
    total = sum(sizes[i] for i in positions)
    ways = max(1, min(connections, total // MIN_SPLIT, len(positions)))
    per_request = min(max_bytes, -(-total // ways))
    chunks: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for pos in positions:
        n = sizes[pos]
        full = len(cur) >= max_items or cur_bytes + n > per_request
        if cur and full and (together is None or together[pos] != together[cur[-1]]):
            chunks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(pos)
        cur_bytes += n
    if cur:
        chunks.append(cur)
    return chunks
