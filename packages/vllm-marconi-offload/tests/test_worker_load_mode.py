"""`load_mode: auto` on a worker: every tensor-parallel rank loads by the choice `agree`
returns (rank 0's), only rank 0 logs the line, a pinned mode times and agrees on nothing,
and a CPU worker, which has one path, chooses `same_step`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm  # the worker imports torch
torch = pytest.importorskip("torch")

from test_pool import fake_vllm_config, layout  # noqa: E402
from vllm_marconi_offload.config import OffloadConfig  # noqa: E402
from vllm_marconi_offload.log import logger  # noqa: E402
from vllm_marconi_offload.pool import build_store_config  # noqa: E402
from vllm_marconi_offload.worker import OffloadWorker  # noqa: E402


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """The connector's log lines while the test runs."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def registered(
    tmp_path: Path, rank: int, agree: Callable[[str], str], load_mode: str = "auto"
) -> OffloadWorker:
    """Rank `rank` of a TP=2 engine on CPU, its KV cache registered."""
    vllm_config = fake_vllm_config(tmp_path)
    vllm_config.parallel_config.tensor_parallel_size = 2
    config = OffloadConfig.from_extra_config(
        {
            "cpu_pool_path": str(tmp_path / "l1"),
            "cpu_bytes_to_use": 64 * 8192,
            "load_mode": load_mode,
        }
    )
    store_config = build_store_config(vllm_config, config, layout(), 32)
    worker = OffloadWorker(store_config, layout(), rank, config, agree=agree)
    worker.register_kv_caches(
        {name: torch.zeros(8, 4096, dtype=torch.uint8) for name in ("l0", "l1")}
    )
    return worker


def test_a_rank_loads_by_rank_zeros_choice_and_says_nothing(
    tmp_path: Path, lines: list[str]
) -> None:
    offered: list[str] = []

    def rank_zero_chose_layer_wise(choice: str) -> str:
        offered.append(choice)
        return "layer_wise"

    worker = registered(tmp_path, 1, rank_zero_chose_layer_wise)
    try:
        assert offered == ["same_step"]  # its own choice: a CPU worker has one path
        assert worker.load_mode == "layer_wise"
        assert not [line for line in lines if "load_mode auto" in line]
    finally:
        worker.shutdown()


def test_rank_zero_logs_one_line_with_its_choice(tmp_path: Path, lines: list[str]) -> None:
    worker = registered(tmp_path, 0, lambda choice: choice)
    try:
        assert worker.load_mode == "same_step"
        assert [line for line in lines if "load_mode auto" in line] == [
            "vllm-marconi-offload worker rank 0: load_mode auto: layer_wise not timed, same_step "
            "(synchronous copies) not timed -> same_step (layer_wise needs a CUDA KV cache and a "
            "page-locked L1; this worker copies synchronously)"
        ]
    finally:
        worker.shutdown()


def test_a_pinned_mode_is_kept_without_timing_or_agreeing(tmp_path: Path, lines: list[str]) -> None:
    def never(choice: str) -> str:
        raise AssertionError("a pinned load_mode needs no agreement")

    worker = registered(tmp_path, 0, never, load_mode="layer_wise")
    try:
        assert worker.load_mode == "layer_wise"
        assert not [line for line in lines if "load_mode auto" in line]
    finally:
        worker.shutdown()
