"""vLLM's real scheduler with our connector in both roles, no model (see engine_loop.py).

Runs on every vLLM in the matrix, and is how vLLM 0.33 (no CPU build) is covered: the
`scheduler` nox session installs its GPU wheel over the CPU torch. Every token vLLM counts
as already computed has its KV checked against what computing it would have written, so a
load of the wrong bytes, into the wrong block, or for the wrong prefix fails here.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_loop import EngineLoop

BLOCK = 16


def prompt(seed: int, blocks: int, prefix: list[int] | None = None) -> list[int]:
    rng = random.Random(seed)
    return (prefix or []) + [rng.randrange(1, 700) for _ in range(blocks * BLOCK + 3)]


def full_blocks(tokens: list[int]) -> int:
    return (len(tokens) - 1) // BLOCK * BLOCK


@pytest.fixture
def engines() -> Iterator[list[EngineLoop]]:
    """Open engines (shut down at teardown)."""
    opened: list[EngineLoop] = []
    yield opened
    for engine in opened:
        engine.shutdown()


def open_engine(engines: list[EngineLoop], model: str, **extra: object) -> EngineLoop:
    engine = EngineLoop(model, dict(extra), block_size=BLOCK)
    engines.append(engine)
    return engine


@pytest.mark.parametrize("load_mode", ["async", "same_step"])
def test_l1_hits_load_the_right_bytes(
    tiny_llama: str, engines: list[EngineLoop], tmp_path: Path, load_mode: str
) -> None:
    engine = open_engine(
        engines,
        tiny_llama,
        cpu_pool_path=str(tmp_path / "l1"),
        cpu_bytes_to_use=16 << 20,
        load_mode=load_mode,
    )
    shared = prompt(1, 4)
    a, b = prompt(2, 4, shared), prompt(3, 2, shared)
    first = engine.generate([a])
    engine.reset_prefix_cache()
    second = engine.generate([a, b])
    assert second[0] == {"tokens": first[0]["tokens"], "cached": full_blocks(a)}
    assert second[1]["cached"] == len(shared) // BLOCK * BLOCK  # the shared blocks only
    assert engine.checked_tokens == second[0]["cached"] + second[1]["cached"]


def test_l2_serves_blocks_l1_evicted(
    tiny_llama: str, engines: list[EngineLoop], tmp_path: Path
) -> None:
    engine = open_engine(
        engines,
        tiny_llama,
        cpu_pool_path=str(tmp_path / "l1"),
        cpu_bytes_to_use=12 * 4096,  # 12 slots of one block x 2 layers
        l2_pool_path=str(tmp_path / "l2"),
        l2_bytes_to_use=16 << 20,
        eviction_policy="lru",
    )
    a = prompt(5, 8)
    engine.generate([a])
    engine.generate([prompt(100 + i, 8) for i in range(3)])  # pushes A out of L1
    engine.reset_prefix_cache()
    again = engine.generate([a])
    assert again[0]["cached"] == full_blocks(a)
    assert engine.checked_tokens == full_blocks(a)


def test_pressure_and_preemption_never_load_wrong_kv(
    tiny_llama: str, engines: list[EngineLoop], tmp_path: Path
) -> None:
    """More live context than the 64-block GPU cache holds: vLLM preempts and evicts, we
    store and load around it. Whatever vLLM counts as computed must still be right."""
    engine = open_engine(
        engines, tiny_llama, cpu_pool_path=str(tmp_path / "l1"), cpu_bytes_to_use=16 << 20
    )
    shared = prompt(7, 3)
    prompts = [prompt(200 + i, 10, shared) for i in range(6)]
    first = engine.generate(prompts)
    second = engine.generate(prompts)
    assert [r["tokens"] for r in second] == [r["tokens"] for r in first]
    assert sum(r["cached"] for r in second) > sum(r["cached"] for r in first)
    assert engine.checked_tokens >= sum(r["cached"] for r in second)
