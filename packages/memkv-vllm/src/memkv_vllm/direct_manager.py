"""Scheduler side of direct mode: adopts the workers' key prefix, answers lookups.

A block counts as present only if every TP rank's value is (one batched `exists` round
per scheduler step for all of them). Stores are not trusted until MemKV says so: a
worker that could not store reports success anyway (vLLM cannot take store failures),
so the lookup cache is never told 'present' by `complete_store`. Under
`.connector.MemKVOffloadingConnector`, a step that reports blocks which could not be
loaded drops every cached answer and answers misses for one stall budget: the request
recomputes, and lookups after that ask the store again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from . import _compat as c
from ._compat import warn_if_hashes_differ_per_process
from .kv_events import SharedTierEvents
from .load_errors import current as current_load_errors
from .load_store_spec import MemKVLoadStoreSpec
from .lookup import Answer, BatchedLookup
from .metrics import TierMetrics
from .naming import direct_key, prefix_differences, publish_key, split_prefix_record
from .request_params import loads_from_shared_store, stores_to_shared_store
from .scheduler_lookup import SchedulerLookup
from .store import KVStore, open_store

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import (
        LookupResult,
        OffloadingEvent,
        OffloadKey,
        PrepareStoreOutput,
        ReqContext,
        RequestOffloadingContext,
        ScheduleEndContext,
    )

    from .config import DirectConfig
    from .store import StoreConfig

__all__ = ["MemKVDirectManager", "adopt_prefix"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


def adopt_prefix(store: KVStore, engine_id: str, world_size: int, timeout: float) -> bytes:
    """Read every worker's published key prefix; fail unless all ranks agree."""
    deadline = time.monotonic() + timeout
    found: dict[int, bytes] = {}
    while True:
        for rank in range(world_size):
            if rank not in found:
                value = store.get_record(publish_key(engine_id, rank))
                if value is not None:
                    found[rank] = value
        if len(found) == world_size or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    missing = [r for r in range(world_size) if r not in found]
    if missing:
        raise RuntimeError(
            f"memkv-vllm: worker rank(s) {missing} published no key prefix under "
            f"{publish_key(engine_id, missing[0])!r} within {timeout:g}s "
            "(memkv_publish_timeout_s); check that every node reaches the same store"
        )
    prefixes = {rank: split_prefix_record(record)[0] for rank, record in found.items()}
    if len(set(prefixes.values())) != 1:
        raise RuntimeError(
            "memkv-vllm: worker ranks key KV blocks differently (model, weights, dtype or "
            f"KV layout differ between ranks): {prefix_differences(found)}"
        )
    try:
        store.delete([publish_key(engine_id, rank) for rank in range(world_size)])
    except Exception as exc:  # the records are small and harmless
        log.debug("memkv-vllm: could not delete the prefix records: %s", exc)
    return prefixes[0]


class MemKVDirectManager(c.OffloadingManager):  # type: ignore[misc]
    """The scheduler side of `.spec.MemKVOffloadingSpec` for engine `engine_id` with
    `world_size` worker ranks."""

    def __init__(
        self,
        cfg: DirectConfig,
        store_config: StoreConfig,
        engine_id: str,
        world_size: int,
        *,
        events: bool = False,
    ) -> None:
        """`events`: report what this engine stores and finds (vLLM's KV events are on)."""
        warn_if_hashes_differ_per_process()
        self._events = SharedTierEvents() if events else None
        # the workers' stores share what they find down with this one (and back)
        self._kv = open_store(store_config, True, "direct scheduler", engine=engine_id)
        self._ranks = range(world_size)
        self.prefix = adopt_prefix(
            self._kv, engine_id, len(self._ranks), cfg.memkv_publish_timeout_s
        )
        progress = threading.Event()
        self._lookup = BatchedLookup(
            self._kv.exists,
            hit_ttl=cfg.memkv_lookup_hit_ttl_s,
            miss_ttl=cfg.memkv_lookup_miss_ttl_s,
            timeout=min(cfg.memkv_lookup_timeout_s, store_config.stall_budget_s),
            settings_hint=self._kv.settings_hint,
            progress=progress,
            unanswered=self._kv.unanswered,
        )
        self._lookups = SchedulerLookup(self._lookup, TierMetrics(), progress, self._kv.health)
        load_errors = current_load_errors()  # set under MemKVOffloadingConnector
        if load_errors is not None:
            # a failed load is retried from the store only after a budget: a member that
            # timed out answers lookups (a Mooncake master) while its data does not
            hold = store_config.stall_budget_s
            load_errors.on_scheduler_failure(lambda: self._lookup.forget(hold))
        log.info("memkv-vllm: direct offload on %s, key prefix %s", self._kv.describe(),
                 self.prefix.hex())  # fmt: skip

    def _names(self, key: OffloadKey) -> list[bytes]:
        return [direct_key(self.prefix, r, key) for r in self._ranks]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if not loads_from_shared_store(req_context):
            return self._lookups.result(Answer.MISS)  # kv_load_tiers leaves MemKV out
        answer = self._lookup.query_all(self._names(key))
        if self._events is not None:
            self._events.on_lookup(key, answer)
        return self._lookups.result(answer)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> MemKVLoadStoreSpec:
        return MemKVLoadStoreSpec(list(keys))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput:
        if not stores_to_shared_store(req_context):
            todo = []  # offload_priority "low": never written to the shared store
        else:
            todo = [k for k in keys if self._lookup.peek_all(self._names(k)) is not Answer.HIT]
        return c.PrepareStoreOutput(
            keys_to_store=todo, store_spec=MemKVLoadStoreSpec(todo), evicted_keys=[]
        )

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        # not trusted as 'present' (see the module docstring), but a cached 'absent' from
        # before the store is stale now: ask MemKV again next time
        self._lookup.invalidate(n for k in keys for n in self._names(k))
        if self._events is not None and success:
            self._events.present(keys)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return c.RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """What this engine stored to and found in MemKV (`.kv_events`)."""
        return self._events.take() if self._events is not None else ()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.on_schedule_end()

    def has_pending_work(self) -> bool:
        return self._lookups.pending()

    def reset_cache(self) -> None:
        self._lookup.forget()

    def get_stats(self) -> OffloadingConnectorStats | None:
        return self._lookups.take_stats()

    def shutdown(self) -> None:
        self._lookups.close()
        self._kv.close()
