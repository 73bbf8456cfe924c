"""Replay a trace through a capacity-limited prefix cache under one policy.

Per request, in arrival order (a trailing partial block of a prompt is dropped first, as
vLLM never caches one; `store_partial_blocks=True` keeps it, the simulator's behaviour
before 2026-12, for traces such as Mooncake's whose block hashes include it):

1. Lookup: the hit is the longest prefix of the request's blocks that is cached (as
   vLLM's prefix matching does); every hit block is touched and pinned.
2. Store: every missed block is shown to the admission tracker; blocks are stored in
   chain order while they are admitted and space can be made (evicting one victim per
   block, the request's own blocks pinned); storing stops at the first block that is
   not admitted or finds no victim, because later blocks could never be reached.
3. Unpin the request's blocks and advance the policy clock by one tick.

`belady` is offline: it ignores the admission tracker and may bypass a block (store
it, then evict it at once when its next use is the farthest).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..admission import AdmissionTracker
from ..policy import EvictionPolicy
from .belady import BeladyPolicy
from .trace import Trace

__all__ = ["DEFAULT_KV_BYTES_PER_TOKEN", "SimResult", "simulate"]

# Llama-3-8B in fp16: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
DEFAULT_KV_BYTES_PER_TOKEN = 131072


@dataclass(frozen=True)
class SimResult:
    """Outcome of one replay."""

    policy: str
    capacity: int
    """Cache capacity in blocks."""
    requests: int
    input_tokens: int
    hit_tokens: int
    hit_requests: int
    """Requests with at least one prefix block served from the cache."""
    blocks_written: int
    bytes_written: int
    evictions: int

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else 0.0


def simulate(
    trace: Trace,
    policy: EvictionPolicy | Callable[[Trace], EvictionPolicy],
    capacity: int,
    *,
    admission_threshold: int = 1,
    admission_max_entries: int = 1 << 20,
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN,
    label: str | None = None,
    store_partial_blocks: bool = False,
) -> SimResult:
    """Replay `trace` through a cache of `capacity` blocks under a fresh `policy`.

    `policy` is an empty policy instance or a factory called with the trace (the way
    to build `BeladyPolicy.for_requests`). A prompt's trailing partial block is neither
    looked up nor stored unless `store_partial_blocks`.
    """
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1 block; got {capacity}")
    if not isinstance(policy, EvictionPolicy):
        policy = policy(trace)
    if len(policy):
        raise ValueError("simulate needs an empty policy")
    offline = isinstance(policy, BeladyPolicy)
    tracker = AdmissionTracker(1 if offline else admission_threshold, admission_max_entries)
    block_size = trace.block_size
    hit_tokens = hit_requests = input_tokens = written = 0
    for request in trace.requests:
        blocks = request.blocks
        if not store_partial_blocks:
            blocks = blocks[: request.input_tokens // block_size]
        input_tokens += request.input_tokens
        hits = 0
        while hits < len(blocks) and blocks[hits] in policy:
            hits += 1
        pinned: list[Hashable] = []
        for i in range(hits):
            key = blocks[i]
            policy.touch(key)
            policy.pin(key)
            pinned.append(key)
            hit_tokens += request.block_tokens(i, block_size)
        hit_requests += hits > 0
        storing = True
        for i in range(hits, len(blocks)):
            key = blocks[i]
            admitted = tracker.observe(key)
            if not (storing and admitted) or key in policy:
                storing = False
                continue
            if not offline and len(policy) >= capacity and not policy.pop_victims(1):
                storing = False
                continue
            policy.insert(key, parent=blocks[i - 1] if i else None, depth=i)
            if offline and len(policy) > capacity and policy.pop_victims(1) == [key]:
                storing = False  # bypassed: its next use is the farthest
                continue
            policy.pin(key)
            pinned.append(key)
            written += 1
        for key in pinned:
            policy.unpin(key)
        policy.tick()
    return SimResult(
        policy=label or policy.name,
        capacity=capacity,
        requests=len(trace.requests),
        input_tokens=input_tokens,
        hit_tokens=hit_tokens,
        hit_requests=hit_requests,
        blocks_written=written,
        bytes_written=written * block_size * kv_bytes_per_token,
        evictions=policy.stats().evictions,
    )
