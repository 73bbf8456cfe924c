"""Direct mode's failed loads, routed into vLLM's own recompute path.

vLLM's `OffloadingConnector` asserts that every worker transfer succeeded, so a value
that vanished from MemKV between lookup and load (evicted, or the server restarted) would
stop the engine. `.connector.MemKVOffloadingConnector` opens a `LoadErrors`
while vLLM builds its spec's manager and worker (`attached`); the direct manager and
worker pick it up with `current`:

* worker side: the worker reports such a load as done and hands the GPU block ids it could
  not fill to `LoadErrors.add_blocks`; the connector returns them from
  `get_block_ids_with_load_errors` in the same step, and vLLM's scheduler recomputes
  from the first bad block (`kv_load_failure_policy="recompute"`).
* scheduler side: when a step reports bad blocks, `LoadErrors.scheduler_saw_failure`
  tells the manager, which drops its cached lookup answers so the retry asks MemKV again.

Without the connector, `current` is None and the worker keeps failing such loads
(vLLM then stops rather than use the unfilled blocks). No vLLM import.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar

__all__ = ["LoadErrors", "attached", "current"]


class LoadErrors:
    """Block ids whose load failed (worker side) and failure listeners (scheduler side)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: set[int] = set()
        self._listeners: list[Callable[[], None]] = []

    def add_blocks(self, block_ids: Iterable[int]) -> None:
        with self._lock:
            self._blocks.update(int(b) for b in block_ids)

    def take_blocks(self) -> set[int]:
        """The block ids added since the last call (and forget them)."""
        with self._lock:
            out, self._blocks = self._blocks, set()
        return out

    def on_scheduler_failure(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def scheduler_saw_failure(self) -> None:
        for listener in list(self._listeners):
            listener()


_current: ContextVar[LoadErrors | None] = ContextVar("memkv_vllm_load_errors", default=None)


@contextlib.contextmanager
def attached(errors: LoadErrors) -> Iterator[LoadErrors]:
    """Make `errors` what `current` returns while vLLM builds the manager/worker."""
    token = _current.set(errors)
    try:
        yield errors
    finally:
        _current.reset(token)


def current() -> LoadErrors | None:
    return _current.get()
