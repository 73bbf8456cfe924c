"""Batched asynchronous presence lookups: one `exists` round per scheduler step.

vLLM asks about one key at a time and must never block. `BatchedLookup.query`
answers from a small TTL cache, or queues the key and answers PENDING (vLLM's RETRY).
`BatchedLookup.flush` (called once per scheduler step) sends every queued key in one
`exists` call on a background thread; its answers land in the cache for the next step.
One round flies at a time; keys queued while it flies go in the next round, which the
ending round starts itself rather than waiting for the next step's flush.
A round that errors, or is still unanswered after `timeout` seconds, resolves its keys
as absent, so a dead server degrades to recompute instead of stalling requests; an
unanswered round is also reported (`unanswered`), so the store skips its members for the
loads that follow instead of waiting on them again.
No vLLM import.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["Answer", "BatchedLookup"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


class Answer(enum.Enum):
    HIT = "hit"
    MISS = "miss"
    PENDING = "pending"


class BatchedLookup:
    """TTL-cached, batched `exists` lookups; thread-safe.

    `exists` is the batched probe (`Client.exists`: names -> presence flags); a 'present'
    answer is reused for `hit_ttl` seconds, an 'absent' one for `miss_ttl`; a round still
    unanswered after `timeout` seconds resolves as absent, and is passed to `unanswered`
    (optional; `KVStore.unanswered`) with its names and whether it is still running.
    `progress` (optional) is set whenever a round ends, for a scheduler that waits
    instead of spinning.
    """

    MAX_CACHED = 1 << 20

    def __init__(
        self,
        exists: Callable[[list[bytes]], list[bool]],
        *,
        hit_ttl: float,
        miss_ttl: float,
        timeout: float,
        settings_hint: str,
        clock: Callable[[], float] = time.monotonic,
        progress: threading.Event | None = None,
        unanswered: Callable[[list[bytes], Callable[[], bool]], None] | None = None,
    ) -> None:
        self._exists = exists
        self._unanswered = unanswered
        self._progress = progress
        self._settings_hint = settings_hint
        self._hit_ttl = hit_ttl
        self._miss_ttl = miss_ttl
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[bytes, tuple[bool, float]] = {}
        self._marked: dict[bytes, float] = {}  # names marked by mark() while a round flies
        self._queued: dict[bytes, None] = {}
        self._inflight: list[bytes] = []
        self._inflight_set: set[bytes] = set()
        self._round: Future[list[bool]] | None = None
        self._round_started = 0.0
        self._hold_until = 0.0
        self._closed = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="memkv-lookup")
        self.rounds = 0
        self.errors = 0

    # --- called by the scheduler (never blocks on the network) --------------------------

    def query(self, name: bytes) -> Answer:
        with self._lock:
            self._collect_locked()
            return self._answer_locked(name, self._clock())

    def query_all(self, names: Iterable[bytes]) -> Answer:
        """HIT if every name is present, MISS if any is absent, else PENDING."""
        with self._lock:
            self._collect_locked()
            now = self._clock()
            answers = [self._answer_locked(n, now) for n in names]
        if Answer.MISS in answers:
            return Answer.MISS
        return Answer.PENDING if Answer.PENDING in answers else Answer.HIT

    def flush(self) -> None:
        """Start one `exists` round for every queued name (if none is in flight)."""
        with self._lock:
            round_ = self._start_round_locked()
        if round_ is not None:  # outside the lock: a round already done calls back here
            round_.add_done_callback(self._round_ended)

    def mark(self, names: Iterable[bytes], present: bool, ttl: float | None = None) -> None:
        """Record what a store or load just proved about `names`."""
        with self._lock:
            expires = self._clock() + (
                ttl if ttl is not None else (self._hit_ttl if present else self._miss_ttl)
            )
            for n in names:
                self._known[n] = (present, expires)
                self._queued.pop(n, None)
                if self._round is not None:
                    self._marked[n] = expires

    def peek_all(self, names: Iterable[bytes]) -> Answer:
        """Like `query_all` from the cache only: queues nothing."""
        now = self._clock()
        with self._lock:
            known = [self._known.get(n) for n in names]
        if any(k is None or k[1] <= now for k in known):
            return Answer.PENDING
        return Answer.HIT if all(k is not None and k[0] for k in known) else Answer.MISS

    def invalidate(self, names: Iterable[bytes]) -> None:
        """Drop the cached answers for `names`: the next query asks MemKV again."""
        with self._lock:
            for n in names:
                self._known.pop(n, None)
                if self._round is not None:
                    self._marked[n] = 0.0  # the flying round's answer is stale for n

    def forget(self, hold_s: float = 0.0) -> None:
        """Drop every cached answer, and the answers of a round still in flight (vLLM's
        `reset_cache`, or a load that failed); for `hold_s` seconds every query answers
        MISS without asking (a load that just failed is not retried at once)."""
        with self._lock:
            self._hold_until = self._clock() + hold_s
            self._known.clear()
            if self._round is not None:
                self._marked.update(dict.fromkeys(self._inflight, 0.0))

    def pending(self) -> bool:
        with self._lock:
            return bool(self._queued) or self._round is not None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- internals ----------------------------------------------------------------------

    def _start_round_locked(self) -> Future[list[bool]] | None:
        self._collect_locked()
        if self._closed or self._round is not None or not self._queued:
            return None
        self._inflight = list(self._queued)
        self._inflight_set = set(self._inflight)
        self._queued.clear()
        self._round_started = self._clock()
        self._round = self._executor.submit(self._exists, list(self._inflight))
        self.rounds += 1
        return self._round

    def _round_ended(self, _: Future[list[bool]]) -> None:
        self.flush()  # the names queued while it flew, without waiting for the next step
        if self._progress is not None:
            self._progress.set()

    def _answer_locked(self, name: bytes, now: float) -> Answer:
        if now < self._hold_until:
            return Answer.MISS
        known = self._known.get(name)
        if known is not None and known[1] > now:
            return Answer.HIT if known[0] else Answer.MISS
        if name not in self._queued and name not in self._inflight_set:
            self._queued[name] = None
        return Answer.PENDING

    def _collect_locked(self) -> None:
        round_ = self._round
        if round_ is None:
            return
        now = self._clock()
        if round_.done():
            try:
                flags = round_.result()
            except Exception as exc:
                self.errors += 1
                log.warning(
                    "memkv-vllm: exists round failed (%s); treating keys as absent (%s)",
                    exc, self._settings_hint,
                )  # fmt: skip
                flags = [False] * len(self._inflight)
        elif now - self._round_started > self._timeout:
            self.errors += 1
            log.warning(
                "memkv-vllm: exists round unanswered after %.1fs; treating %d keys as absent "
                "(%s)",
                self._timeout, len(self._inflight), self._settings_hint,
            )  # fmt: skip
            if self._unanswered is not None:
                self._unanswered(list(self._inflight), lambda: not round_.done())
            flags = [False] * len(self._inflight)
        else:
            return
        for name, present in zip(self._inflight, flags, strict=True):
            if name in self._marked:
                continue  # a store or load proved more recently than this round asked
            self._known[name] = (present, now + (self._hit_ttl if present else self._miss_ttl))
        self._marked.clear()
        self._inflight = []
        self._inflight_set = set()
        self._round = None
        if len(self._known) > self.MAX_CACHED:
            self._known = {k: v for k, v in self._known.items() if v[1] > now}
