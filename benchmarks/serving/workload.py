"""Arrival-timed multi-turn sessions, the same for every mode of one rate.

A session arrives at a Poisson time and runs `turns` requests one after another, with an
exponential think time after each response. Every prompt is token ids: a system prompt
shared by all sessions, the session's own context, then per turn a user message and (from
the second turn on) a stand-in for the previous reply. The stand-in is fixed by the seed,
not taken from the server's output, so turn k+1's prompt starts with turn k's prompt in
every mode and the workload never depends on what a mode generated. Everything is drawn
from `random.Random` seeded by (seed, session id): a mode, a rerun or another host gets the
same sessions.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    """Sizes of the workload (tokens and seconds)."""

    system_tokens: int = 512
    context_tokens: tuple[int, int] = (3000, 5000)
    turns: int = 4
    user_tokens: tuple[int, int] = (150, 400)
    output_tokens: tuple[int, int] = (64, 256)
    think_s: float = 3.0
    vocab: tuple[int, int] = (3, 32000)
    """Token ids are drawn from [low, high)."""

    def mean_prompt_tokens(self) -> float:
        """Mean prompt length over a session's turns (the KV a live session holds)."""
        context = sum(self.context_tokens) / 2
        user, output = sum(self.user_tokens) / 2, sum(self.output_tokens) / 2
        # turn k (1-based) carries k user messages and the k - 1 replies before it
        return (
            self.system_tokens + context + (user * (self.turns + 1) + output * (self.turns - 1)) / 2
        )

    def longest_request_tokens(self) -> int:
        """The most tokens one request can need: the last turn's longest prompt and reply."""
        return (
            self.system_tokens
            + self.context_tokens[1]
            + self.user_tokens[1] * self.turns
            + self.output_tokens[1] * self.turns
        )


@dataclass(frozen=True)
class Turn:
    prompt: list[int]
    max_tokens: int
    think_s: float
    """Pause after this turn's response, before the next turn is sent."""


@dataclass(frozen=True)
class Session:
    sid: int
    arrival_s: float
    turns: list[Turn]


def sessions(seed: int, rate: float, duration_s: float, shape: Shape) -> list[Session]:
    """Sessions arriving at `rate` per second (Poisson) during `duration_s` seconds."""
    arrivals = random.Random(seed)
    system = _tokens(random.Random(f"{seed}-system"), shape.system_tokens, shape)
    out: list[Session] = []
    t = arrivals.expovariate(rate)
    while t < duration_s:
        sid = len(out)
        out.append(Session(sid, t, _turns(random.Random(f"{seed}-{sid}"), system, shape)))
        t += arrivals.expovariate(rate)
    return out


def _tokens(rng: random.Random, n: int, shape: Shape) -> list[int]:
    return [rng.randrange(*shape.vocab) for _ in range(n)]


def _turns(rng: random.Random, system: list[int], shape: Shape) -> list[Turn]:
    history = system + _tokens(rng, rng.randint(*shape.context_tokens), shape)
    turns: list[Turn] = []
    for _ in range(shape.turns):
        if turns:  # the previous reply, as the next prompt carries it
            history += _tokens(rng, turns[-1].max_tokens, shape)
        history += _tokens(rng, rng.randint(*shape.user_tokens), shape)
        think = rng.expovariate(1 / shape.think_s) if shape.think_s > 0 else 0.0
        turns.append(Turn(list(history), rng.randint(*shape.output_tokens), think))
    return turns


def rate_for_overflow(
    factor: float, hbm_kv_bytes: int, kv_bytes_per_token: int, shape: Shape, turn_s: float
) -> float:
    """Session arrival rate whose live sessions hold `factor` x the HBM KV cache.

    By Little's law, live sessions = rate x session lifetime, the lifetime being
    `turns` x (`turn_s`, an estimate of one response's latency, + the mean think time);
    each live session holds its mean prompt length of KV. The client measures the live
    KV it actually produced (`live_kv_over_hbm` in the results).
    """
    hbm_tokens = hbm_kv_bytes / kv_bytes_per_token
    lifetime = shape.turns * (turn_s + shape.think_s)
    return factor * hbm_tokens / (shape.mean_prompt_tokens() * lifetime)


def kv_bytes_per_token(model_dir: Path, dtype_bytes: int) -> int:
    """KV bytes one token takes in a Llama-style model's cache (K and V, every layer)."""
    config = json.loads((model_dir / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return int(config["num_hidden_layers"]) * int(heads) * int(head_dim) * 2 * dtype_bytes
