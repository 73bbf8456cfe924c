"""A step's transfer jobs move as one batch per KV-cache group, in job order, and each job
knows where its own blocks end (so its request can start as soon as they have landed)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm  # the worker imports torch
pytest.importorskip("torch")

from vllm_marconi_offload.plan import BlockTransfer, TransferJob  # noqa: E402
from vllm_marconi_offload.worker import _by_group  # noqa: E402


def job(job_id: int, *transfers: tuple[int, list[int], list[int]]) -> TransferJob:
    return TransferJob(
        job_id,
        f"req-{job_id}",
        tuple(BlockTransfer(g, tuple(blocks), tuple(slots)) for g, blocks, slots in transfers),
    )


def test_jobs_are_concatenated_per_group_with_each_jobs_end() -> None:
    jobs = [
        job(1, (0, [4, 5], [10, 11]), (1, [7], [3])),
        job(2, (0, [9], [12])),  # nothing in group 1: ends where job 1 ended
        job(3, (1, [8, 2], [4, 5]), (0, [1, 6, 3], [0, 1, 2])),
    ]
    grouped = _by_group(jobs)
    assert grouped[0] == ([4, 5, 9, 1, 6, 3], [10, 11, 12, 0, 1, 2], [2, 3, 6])
    assert grouped[1] == ([7, 8, 2], [3, 4, 5], [1, 1, 3])


def test_no_jobs_no_groups() -> None:
    assert _by_group([]) == {}
