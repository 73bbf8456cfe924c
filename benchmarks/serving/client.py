"""Drive a vLLM OpenAI server with the sessions of `workload.sessions` (asyncio + aiohttp).

Each session is one task: it waits for its arrival time, then sends its turns one at a
time as streaming `/v1/completions` requests (token-id prompt, greedy, fixed seed,
`ignore_eos`, `return_token_ids`, usage in the last chunk) and sleeps its think time after
each response. A request's TTFT is the time to the first chunk carrying a token; its
inter-token gaps are the times between later chunks (vLLM streams one chunk per engine
step). At `stop_s` every unfinished request is cancelled and counted, not timed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from workload import Session, Turn

SAMPLE_S = 0.5


@dataclass
class Record:
    """One request: what was sent, when its chunks came, what it generated."""

    sid: int
    turn: int
    sent_s: float
    prompt_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached_tokens: int | None = None
    error: str | None = None


@dataclass
class Load:
    """A run's records, its span (start to the end of the last completed request) and the
    live KV the sessions held (sampled, tokens)."""

    records: list[Record]
    wall_s: float
    live_tokens: list[tuple[float, int]]
    cancelled: int


async def run(url: str, model: str, sessions: list[Session], stop_s: float, seed: int = 0) -> Load:
    """Play `sessions` against the server at `url`; give up on what is open at `stop_s`."""
    records: list[Record] = []
    live: dict[int, int] = {}
    samples: list[tuple[float, int]] = []
    start = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - start

    async def sample() -> None:
        while True:
            samples.append((now(), sum(live.values())))
            await asyncio.sleep(SAMPLE_S)

    async def play(http: aiohttp.ClientSession, session: Session) -> None:
        await asyncio.sleep(max(0.0, session.arrival_s - now()))
        try:
            for index, turn in enumerate(session.turns):
                live[session.sid] = len(turn.prompt)
                record = Record(session.sid, index, now(), len(turn.prompt))
                records.append(record)
                try:
                    await _request(http, url, model, turn, record, seed)
                except aiohttp.ClientError as exc:
                    record.error = f"{type(exc).__name__}: {exc}"
                if record.error is not None:
                    return
                await asyncio.sleep(turn.think_s)
        finally:
            live.pop(session.sid, None)

    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    # A fresh connection per request: reusing one the server closed after its keep-alive
    # (uvicorn: 5 s, shorter than some think times) fails the request before it is sent.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        sampler = asyncio.create_task(sample())
        tasks = [asyncio.create_task(play(http, s)) for s in sessions]
        _, pending = await asyncio.wait(tasks, timeout=stop_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        sampler.cancel()
    # Completed requests only: a request cut at `stop_s` would stretch the span by however
    # long it happened to run before the cut, which differs between modes by chance.
    wall = max((r.sent_s + r.e2e_s for r in records if r.e2e_s is not None), default=0.0)
    cancelled = sum(1 for r in records if r.e2e_s is None and r.error is None)
    return Load(records, wall, samples, cancelled)


async def sequential(
    url: str, model: str, prompts: list[list[int]], max_tokens: int, seed: int = 0
) -> dict[str, list[int]]:
    """Send `prompts` one at a time (each alone in its batches); their tokens keyed by
    index (as `str`)."""
    tokens: dict[str, list[int]] = {}
    async with aiohttp.ClientSession() as http:
        for index, prompt in enumerate(prompts):
            record = Record(-1, index, 0.0, len(prompt))
            await _request(http, url, model, Turn(prompt, max_tokens, 0.0), record, seed)
            if record.error is not None:
                raise RuntimeError(f"check request {index}: {record.error}")
            tokens[str(index)] = record.tokens
    return tokens


async def _request(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    turn: Turn,
    record: Record,
    seed: int,
) -> None:
    body: dict[str, Any] = {
        "model": model,
        "prompt": turn.prompt,
        "max_tokens": turn.max_tokens,
        "temperature": 0.0,
        "seed": seed,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    last: float | None = None
    async with http.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            record.error = f"HTTP {response.status}: {(await response.text())[:300]}"
            return
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                record.cached_tokens = int(details["cached_tokens"])
            ids = [t for choice in chunk.get("choices", []) for t in choice.get("token_ids") or []]
            if not ids:
                continue
            arrived = time.perf_counter()
            if last is None:
                record.ttft_s = arrived - sent
            else:
                record.gaps_s.append(arrived - last)
            last = arrived
            record.tokens += ids
    record.e2e_s = time.perf_counter() - sent
