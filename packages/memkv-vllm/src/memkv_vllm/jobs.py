"""Thread pools that run transfer jobs off the scheduler thread, and their results.

Loads and stores have separate pools so a store backlog never delays a load. Stores
are shed once the queued store bytes would exceed `max_backlog_bytes` (an empty
backlog always admits one job). Results are polled, never called back. No vLLM import.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finished", "JobOutcome", "JobRunner"]


@dataclass
class JobOutcome:
    """What one job did: `ok_keys` are the keys that made it (all of them on success)."""

    success: bool
    ok_keys: Collection[Any] = ()
    failed_keys: Collection[Any] = ()
    nbytes: int = 0


@dataclass
class Finished:
    job_id: int
    is_load: bool
    outcome: JobOutcome
    seconds: float = 0.0
    shed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class JobRunner:
    """Runs loads and stores on their own pools; `progress` (optional) is set whenever
    a job finishes."""

    def __init__(
        self,
        n_read: int,
        n_write: int,
        max_backlog_bytes: int,
        progress: threading.Event | None = None,
    ) -> None:
        self._progress = progress
        self._reads = ThreadPoolExecutor(n_read, thread_name_prefix="memkv-load")
        self._writes = ThreadPoolExecutor(n_write, thread_name_prefix="memkv-store")
        self._max_backlog = max_backlog_bytes
        self._lock = threading.Lock()
        self._backlog = 0
        self._done: deque[Finished] = deque()
        self._futures: set[Future[None]] = set()
        self._by_job: dict[int, Future[None]] = {}

    def submit_load(self, job_id: int, fn: Callable[[], JobOutcome]) -> None:
        self._submit(self._reads, job_id, True, 0, fn)

    def submit_store(self, job_id: int, nbytes: int, fn: Callable[[], JobOutcome]) -> bool:
        """Queue a store; False (and a shed result) if the backlog is over its limit."""
        with self._lock:
            if self._backlog > 0 and self._backlog + nbytes > self._max_backlog:
                self._done.append(Finished(job_id, False, JobOutcome(False), shed=True))
                return False
            self._backlog += nbytes
        self._submit(self._writes, job_id, False, nbytes, fn)
        return True

    def _submit(
        self,
        pool: ThreadPoolExecutor,
        job_id: int,
        is_load: bool,
        nbytes: int,
        fn: Callable[[], JobOutcome],
    ) -> None:
        def run() -> None:
            start = time.perf_counter()
            try:
                outcome = fn()
            except Exception as exc:  # a job must always report, or vLLM leaks its slots
                outcome = JobOutcome(False)
                extra = {"error": repr(exc)}
            else:
                extra = {}
            with self._lock:
                self._backlog -= nbytes
                self._done.append(
                    Finished(job_id, is_load, outcome, time.perf_counter() - start, extra=extra)
                )
            if self._progress is not None:
                self._progress.set()

        future = pool.submit(run)
        with self._lock:
            self._futures.add(future)
            self._by_job[job_id] = future
        future.add_done_callback(lambda f: self._forget(job_id, f))

    def _forget(self, job_id: int, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)
            if self._by_job.get(job_id) is future:
                del self._by_job[job_id]

    def wait_jobs(self, job_ids: Collection[int], timeout: float | None = None) -> bool:
        """Block until the named jobs have finished; False if the timeout ran out first."""
        with self._lock:
            futures = [self._by_job[j] for j in job_ids if j in self._by_job]
        _, not_done = wait(futures, timeout=timeout)
        return not not_done

    def finished(self) -> list[Finished]:
        out: list[Finished] = []
        with self._lock:
            while self._done:
                out.append(self._done.popleft())
        return out

    def pending(self) -> bool:
        with self._lock:
            return bool(self._futures) or bool(self._done)

    @property
    def backlog_bytes(self) -> int:
        with self._lock:
            return self._backlog

    def drain(self, timeout: float | None = None) -> None:
        """Block until every submitted job has finished (results stay queued)."""
        with self._lock:
            futures = set(self._futures)
        wait(futures, timeout=timeout)

    def shutdown(self) -> None:
        self._reads.shutdown(wait=True, cancel_futures=False)
        self._writes.shutdown(wait=True, cancel_futures=False)
