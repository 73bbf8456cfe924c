"""The serving benchmark's workload (`benchmarks/serving/workload.py`): every mode and rerun
plays the same sessions, each turn's prompt extends the previous turn's (what a prefix cache
or an offload tier can serve), and the mean prompt length that plans the request rates is the
one the sessions have."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "serving"))
import workload

SHAPE = workload.Shape(
    system_tokens=64,
    context_tokens=(300, 500),
    turns=3,
    user_tokens=(32, 64),
    output_tokens=(100, 200),
    think_s=1.0,
    vocab=(10, 700),
)


def test_one_seed_gives_the_same_sessions_another_seed_other_ones() -> None:
    first = workload.sessions(1, 2.0, 20.0, SHAPE)
    assert first == workload.sessions(1, 2.0, 20.0, SHAPE)
    other = workload.sessions(2, 2.0, 20.0, SHAPE)
    assert [s.arrival_s for s in other] != [s.arrival_s for s in first]
    assert other[0].turns[0].prompt[:64] != first[0].turns[0].prompt[:64]  # system prompts


def test_each_turn_carries_the_previous_prompt_its_reply_and_a_user_message() -> None:
    for session in workload.sessions(3, 2.0, 20.0, SHAPE):
        assert len(session.turns) == SHAPE.turns
        for before, turn in zip(session.turns, session.turns[1:], strict=False):
            assert turn.prompt[: len(before.prompt)] == before.prompt
            added = len(turn.prompt) - len(before.prompt) - before.max_tokens
            assert SHAPE.user_tokens[0] <= added <= SHAPE.user_tokens[1]


def test_planned_mean_prompt_is_the_sessions_mean_prompt() -> None:
    prompts = [
        len(turn.prompt)
        for session in workload.sessions(4, 50.0, 20.0, SHAPE)
        for turn in session.turns
    ]
    assert statistics.mean(prompts) == pytest.approx(SHAPE.mean_prompt_tokens(), rel=0.02)
