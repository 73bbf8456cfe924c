"""Seeded synthetic workloads with known prefix structure.

* `agents`: many agents share one system prompt; each runs a multi-step loop whose
  prompt is the system prompt, its task and its growing history.
* `sessions`: chat sessions on a few apps (each app one system prompt); turns follow
  each other after a short think time, but sessions often idle for minutes and resume.
* `rag`: a shared system prompt, one retrieved document drawn from a Zipf popularity
  distribution, and a question that is never repeated.
* `cycle`: sessions in lockstep rounds (the multi-turn GPU benchmark's shape): every round
  appends a turn to every session and sends each whole history, one session after another,
  so the sessions come back in a cycle that may be longer than the cache.

Lengths are in tokens; block hashes chain over (segment, token range) pieces
(`trace.chain_hashes`), so only the trailing partial block of a prompt is uncacheable.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable

from .trace import Request, Trace, chain_hashes

__all__ = ["GENERATORS", "SYNTHETIC_BLOCK_SIZE", "agents", "cycle", "rag", "sessions"]

SYNTHETIC_BLOCK_SIZE = 128


def _multi_turn(
    streams: list[tuple[float, list[tuple[int, int]], list[tuple[int, int, float]]]],
    block_size: int,
) -> list[Request]:
    """Requests from per-session streams.

    Each stream is (start time, segments, turns); a turn (prompt tokens, output tokens,
    gap before it) asks for the first `prompt tokens` of the segment stream.
    """
    requests: list[Request] = []
    for start, segments, turns in streams:
        hashes = chain_hashes(segments, block_size)
        at = start
        for prompt, output, gap in turns:
            at += gap
            requests.append(Request(at, tuple(hashes[: prompt // block_size]), prompt, output))
    requests.sort(key=lambda r: r.arrival)
    return requests


def agents(
    *,
    count: int = 300,
    system_tokens: int = 4096,
    steps_mean: float = 10.0,
    rate: float = 0.5,
    step_gap_s: float = 5.0,
    block_size: int = SYNTHETIC_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """Agents sharing one system prompt, each with a growing tool-use history."""
    rng = random.Random(seed)
    ids = itertools.count(1)
    streams = []
    start = 0.0
    for _ in range(count):
        start += rng.expovariate(rate)
        segments = [(0, system_tokens), (next(ids), rng.randint(256, 1024))]
        turns = []
        length = sum(t for _, t in segments)
        for step in range(max(1, round(rng.expovariate(1.0 / steps_mean)))):
            action = rng.randint(32, 256)
            turns.append((length, action, rng.expovariate(1.0 / step_gap_s) if step else 0.0))
            observation = rng.randint(64, 768)
            segments += [(next(ids), action), (next(ids), observation)]
            length += action + observation
        streams.append((start, segments, turns))
    return Trace("agents", block_size, _multi_turn(streams, block_size))


def sessions(
    *,
    count: int = 400,
    apps: int = 4,
    turns_mean: float = 8.0,
    rate: float = 0.2,
    think_s: float = 20.0,
    idle_probability: float = 0.3,
    idle_s: float = 600.0,
    block_size: int = SYNTHETIC_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """Multi-turn chats that pause (think time) and sometimes idle for long, then resume."""
    rng = random.Random(seed)
    ids = itertools.count(apps)
    app_tokens = [rng.randint(1024, 3072) for _ in range(apps)]
    streams = []
    start = 0.0
    for _ in range(count):
        start += rng.expovariate(rate)
        app = rng.randrange(apps)
        segments = [(app, app_tokens[app])]
        length = app_tokens[app]
        turns = []
        for turn in range(max(1, round(rng.expovariate(1.0 / turns_mean)))):
            user, reply = rng.randint(16, 512), rng.randint(64, 1024)
            segments += [(next(ids), user), (next(ids), reply)]
            length += user
            idle = rng.random() < idle_probability
            gap = rng.expovariate(1.0 / (idle_s if idle else think_s)) if turn else 0.0
            turns.append((length, reply, gap))
            length += reply
        streams.append((start, segments, turns))
    return Trace("sessions", block_size, _multi_turn(streams, block_size))


def cycle(
    *,
    count: int = 48,
    context_tokens: int = 6000,
    turn_tokens: int = 200,
    output_tokens: int = 64,
    rounds: int = 4,
    round_s: float = 10.0,
    block_size: int = 16,
    seed: int = 0,
) -> Trace:
    """`count` sessions of `context_tokens` each (+-10%); every round appends a user turn to
    every session, sends its whole history and appends the reply. Defaults: the multi-turn
    GPU benchmark (48 sessions x 6,000 tokens, 4 rounds, vLLM's 16-token blocks)."""
    rng = random.Random(seed)
    ids = itertools.count(count)
    streams = []
    for session in range(count):
        context = rng.randint(context_tokens * 9 // 10, context_tokens * 11 // 10)
        segments = [(session, context)]
        length = context
        turns = []
        for turn in range(rounds):
            segments += [(next(ids), turn_tokens), (next(ids), output_tokens)]
            length += turn_tokens
            turns.append((length, output_tokens, round_s if turn else 0.0))
            length += output_tokens
        streams.append((session * round_s / (10 * count), segments, turns))
    return Trace("cycle", block_size, _multi_turn(streams, block_size))


def rag(
    *,
    count: int = 4000,
    documents: int = 1000,
    zipf_s: float = 1.1,
    system_tokens: int = 1024,
    rate: float = 2.0,
    block_size: int = SYNTHETIC_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """RAG prompts: system prompt + one Zipf-popular document + a unique question."""
    rng = random.Random(seed)
    doc_tokens = [rng.randint(512, 4096) for _ in range(documents)]
    cumulative = list(
        itertools.accumulate(1.0 / (rank**zipf_s) for rank in range(1, documents + 1))
    )
    doc_blocks: dict[int, list[int]] = {}
    ids = itertools.count(documents + 1)
    requests = []
    at = 0.0
    for _ in range(count):
        at += rng.expovariate(rate)
        doc = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
        question = rng.randint(32, 256)
        prefix = system_tokens + doc_tokens[doc]
        if doc not in doc_blocks:
            doc_blocks[doc] = chain_hashes(
                [(0, system_tokens), (doc + 1, doc_tokens[doc])], block_size
            )
        full = prefix // block_size
        blocks = doc_blocks[doc][:full]
        # the block straddling document and question, and later ones, are unique
        tail = chain_hashes(
            [(0, system_tokens), (doc + 1, doc_tokens[doc]), (next(ids), question)], block_size
        )
        requests.append(
            Request(at, tuple(blocks + tail[full:]), prefix + question, rng.randint(64, 512))
        )
    return Trace("rag", block_size, requests)


GENERATORS: dict[str, Callable[..., Trace]] = {
    "agents": agents,
    "sessions": sessions,
    "rag": rag,
    "cycle": cycle,
}
