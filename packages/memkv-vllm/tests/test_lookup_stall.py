"""A lookup round that a stopped member leaves unanswered, on a real `memkv serve`: the
engine's loads skip that member at once instead of waiting on it again. No vLLM."""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np
import pytest
from memkv_server import MemKVServer
from memkv_vllm.lookup import Answer, BatchedLookup
from memkv_vllm.store import KVStore, StoreConfig, open_store

BUDGET = 1.0
LOOKUP_TIMEOUT = 0.3  # `memkv_lookup_timeout_s` below the store's budget
VALUE = 4096


def open_for(server: MemKVServer, engine: str, monkeypatch: pytest.MonkeyPatch) -> KVStore:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    config = StoreConfig.resolve({"stall_budget_s": BUDGET}, "test")
    return open_store(config, True, "test", engine=engine)


def test_a_lookup_round_left_unanswered_makes_the_engines_loads_skip_the_member(
    memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler gives up on its round at the lookup timeout; a load the worker starts
    right after misses at once (recompute) instead of waiting a second budget."""
    assert memkv.proc is not None
    pid = memkv.proc.pid
    engine = f"test-{uuid.uuid4()}"
    scheduler, worker = (open_for(memkv, engine, monkeypatch) for _ in range(2))
    lookup = BatchedLookup(scheduler.exists, hit_ttl=60, miss_ttl=60, timeout=LOOKUP_TIMEOUT,
                           settings_hint="test", unanswered=scheduler.unanswered)  # fmt: skip
    value = np.full(VALUE, 5, np.uint8)
    try:
        assert all(worker.batch_put([(b"loaded", value, VALUE)]))
        assert lookup.query(b"asked") is Answer.PENDING
        os.kill(pid, signal.SIGSTOP)  # the member stops as the round is sent
        started = time.monotonic()
        lookup.flush()
        while (answer := lookup.query(b"asked")) is Answer.PENDING:
            assert time.monotonic() - started < BUDGET, "the round outlived its timeout"
            time.sleep(0.01)
        asked = time.monotonic() - started
        got = worker.batch_get_into([(b"loaded", np.zeros(VALUE, np.uint8), VALUE)])
        total = time.monotonic() - started
        print(f"round given up after {asked:.3f} s; the load returned {total:.3f} s "
              f"after the round started")  # fmt: skip
        assert answer is Answer.MISS
        assert asked >= LOOKUP_TIMEOUT  # given up, not answered
        assert got[0].unavailable
        assert not got[0]
        assert total < LOOKUP_TIMEOUT + BUDGET / 2  # not a second wait on the member
        assert not worker.health()[0].up
    finally:
        os.kill(pid, signal.SIGCONT)
        lookup.close()
        scheduler.close()
        worker.close()
