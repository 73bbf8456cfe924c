"""vLLM's KV events for our tiers (what differs between releases: `.compat`).

L1 is published as medium `CPU`, L2 as `STORAGE` (`FS` on 0.26, vLLM's name there), both
with locality `LOCAL` where the running vLLM's events have that field. Blocks are named
by vLLM's own block hashes (converted as its GPU events are, see
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`) and KV-cache group; a store event carries the
parent hash, token ids, block size, extra keys and the group's spec kind, as vLLM's GPU
events do. Consecutive blocks of one chain become one event.

Fields are passed only where the running vLLM's event classes declare them
(`compat.stored_event`; `session_id`, 0.32+, we leave unset).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvpool_mmap import Tier
from vllm.distributed import kv_events as vllm_kv_events
from vllm.distributed.kv_events import AllBlocksCleared, KVCacheEvent
from vllm.v1.core import kv_cache_utils
from vllm_kv_identity import key_group

from . import compat
from .block_info import BlockInfo
from .events import Change, block_hash

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

MEDIUMS = {Tier.L1: vllm_kv_events.MEDIUM_CPU, Tier.L2: compat.disk_medium()}
"""Our tiers as vLLM's media: L1 (host memory) is CPU, L2 (local disk) is STORAGE (FS)."""
LOCAL = "LOCAL"


def describe_block(request: Request, index: int, block_size: int) -> BlockInfo:
    """Block `index` of `request` as its store event describes it."""
    start = index * block_size
    end = start + block_size
    extra, _ = kv_cache_utils.generate_block_hash_extra_keys(request, start, end, 0)
    lora = request.lora_request
    return BlockInfo(
        parent_hash=bytes(request.block_hashes[index - 1]) if index else None,
        token_ids=array("i", request.all_token_ids[start:end]),
        extra_keys=extra,
        lora_id=lora.adapter_id if lora is not None else None,
        lora_name=lora.name if lora is not None else None,
    )


class EventBuilder:
    """Turns `Change`s into vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`."""

    def __init__(
        self, block_size: int, kv_cache_config: KVCacheConfig, locality: str = LOCAL
    ) -> None:
        self._block_size = block_size
        self._locality = locality
        self._specs = _group_specs(kv_cache_config)

    def build(self, changes: Iterable[Change]) -> list[KVCacheEvent]:
        events: list[KVCacheEvent] = []
        run: list[Change] = []
        for change in changes:
            if run and not _continues(run[-1], change):
                events.append(self._event(run))
                run = []
            if change.tier is None:
                events.append(AllBlocksCleared())
                continue
            run.append(change)
        if run:
            events.append(self._event(run))
        return events

    def _event(self, run: list[Change]) -> KVCacheEvent:
        first = run[0]
        assert first.tier is not None
        group = key_group(first.key)
        hashes = [_external(block_hash(c.key)) for c in run]
        common: dict[str, Any] = {
            "block_hashes": hashes,
            "medium": MEDIUMS[first.tier],
            "group_idx": group,
            "locality": self._locality,
        }
        if not first.loadable:
            return compat.removed_event(common)
        info = first.info
        kind, window = self._specs.get(group, (None, None))
        fields: dict[str, Any] = {
            **common,
            "kv_cache_spec_kind": kind,
            "kv_cache_spec_sliding_window": window,
        }
        if info is None:  # a block known by hash only (L2 after a crash): vLLM's placeholder
            fields.update(parent_block_hash=None, token_ids=[], block_size=0)
            fields.update(lora_id=None, lora_name=None)
            return compat.stored_event(fields)
        infos = [c.info for c in run if c.info is not None]
        extra = [i.extra_keys for i in infos]
        fields.update(
            parent_block_hash=_external(info.parent_hash) if info.parent_hash is not None else None,
            token_ids=[t for i in infos for t in i.token_ids],
            block_size=self._block_size,
            lora_id=info.lora_id,
            lora_name=info.lora_name,
            extra_keys=compat.event_extra_keys(extra),
        )
        return compat.stored_event(fields)


def _continues(last: Change, change: Change) -> bool:
    """Whether `change` joins the event `last` is in: same tier, direction and group, and
    for stores the next block of the same chain."""
    if change.tier != last.tier or change.loadable != last.loadable or change.tier is None:
        return False
    if key_group(change.key) != key_group(last.key):
        return False
    if not change.loadable:
        return True
    if last.info is None or change.info is None:
        return False  # a hash-only block is an event of its own, as vLLM's placeholders are
    return change.info.parent_hash == block_hash(last.key) and (
        change.info.lora_name == last.info.lora_name
    )


def _external(block_hash: bytes) -> Any:
    """A block hash as vLLM's events publish it (bytes, or an int: see the module doc)."""
    return kv_cache_utils.maybe_convert_block_hash(block_hash)  # type: ignore[arg-type]


def _group_specs(kv_cache_config: KVCacheConfig) -> dict[int, tuple[str | None, int | None]]:
    """Each KV-cache group's spec kind and sliding window, as vLLM's GPU events name them."""
    from vllm.v1.kv_cache_interface import (
        get_kv_cache_spec_kind,
        get_kv_cache_spec_sliding_window,
    )

    specs: dict[int, tuple[str | None, int | None]] = {}
    for group_id, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        specs[group_id] = (
            get_kv_cache_spec_kind(spec).value,
            get_kv_cache_spec_sliding_window(spec),
        )
    return specs
