"""Requests as the simulator sees them: a chain of block hashes plus token counts."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Request", "Trace", "chain_hashes"]

_ROOT = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class Request:
    """One prefill: `blocks[i]` is the hash of prompt block i (its whole prefix)."""

    arrival: float
    """Arrival time in seconds."""
    blocks: tuple[Hashable, ...]
    input_tokens: int
    output_tokens: int = 0

    def block_tokens(self, index: int, block_size: int) -> int:
        """Prompt tokens that block `index` covers (the last block may be partial)."""
        return max(0, min(block_size, self.input_tokens - index * block_size))


@dataclass(frozen=True)
class Trace:
    """A named, arrival-ordered list of requests with one block size."""

    name: str
    block_size: int
    requests: Sequence[Request]

    def unique_blocks(self) -> int:
        """Distinct block hashes in the trace (the capacity that makes misses compulsory)."""
        seen: set[Hashable] = set()
        for request in self.requests:
            seen.update(request.blocks)
        return len(seen)

    def block_accesses(self) -> int:
        """Total blocks over all requests."""
        return sum(len(r.blocks) for r in self.requests)


def chain_hashes(pieces: Iterable[tuple[int, int]], block_size: int) -> list[int]:
    """Hashes of the full blocks of a token stream given as (segment id, tokens) pieces.

    The stream is the concatenation of the segments; block i's hash covers the
    segment slices it holds and the previous block's hash, so equal hashes mean equal
    prefixes. A trailing partial block gets no hash (it is never cached). Deterministic
    across processes (ints and tuples of ints only).
    """
    hashes: list[int] = []
    prev = _ROOT
    content: list[tuple[int, int, int]] = []
    filled = 0
    for segment, tokens in pieces:
        offset = 0
        while offset < tokens:
            take = min(tokens - offset, block_size - filled)
            content.append((segment, offset, offset + take))
            offset += take
            filled += take
            if filled == block_size:
                prev = hash((prev, tuple(content)))
                hashes.append(prev)
                content = []
                filled = 0
    return hashes
