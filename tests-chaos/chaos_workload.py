"""The chaos run's seeded multi-turn workload: sessions that share a system prompt, each
turn the session's history (earlier turns and the model's replies) plus a new user message.

A workload is built once, by an engine without offload (`chaos_engine.py`, reference mode):
its replies are the reference every offloading engine's tokens must equal. Requests are
served in turn order (every session's turn 0, then turn 1, ...), and a cycle is the whole
list.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

BLOCK = 32  # vLLM block size of every chaos engine
SYSTEM_BLOCKS = 3
HIT_TOKENS = SYSTEM_BLOCKS * BLOCK
"""A call that got at least this many cached tokens was served from the offload tier (every
request starts with the shared system prompt, and vLLM's own cache is emptied before each)."""
REPLY_TOKENS = 8


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) in serving order and the reference reply of each."""

    prompts: list[list[int]]
    replies: list[list[int]]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> Workload:
        data = json.loads(path.read_text())
        return cls(prompts=data["prompts"], replies=data["replies"])


def build(
    seed: int,
    sessions: int,
    turns: int,
    vocab: int,
    answer: Callable[[list[int]], list[int]],
) -> Workload:
    """`sessions` conversations of `turns` turns; user messages are 1-2 blocks of random
    token ids in [10, vocab); `answer` gives the model's reply to one prompt."""
    rng = random.Random(seed)

    def message(length: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(length)]

    system = message(SYSTEM_BLOCKS * BLOCK)
    histories = [list(system) for _ in range(sessions)]
    prompts: list[list[int]] = []
    replies: list[list[int]] = []
    for _ in range(turns):
        for history in histories:
            history += message(rng.randrange(BLOCK, 2 * BLOCK))
            reply = answer(list(history))
            prompts.append(list(history))
            replies.append(reply)
            history += reply
    return Workload(prompts, replies)
