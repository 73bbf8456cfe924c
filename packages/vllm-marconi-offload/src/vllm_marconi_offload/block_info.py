"""`BlockInfo`: what makes a block's KV event self-describing (kept by `events.TierEvents`,
persisted by `journal.DescriptionJournal`)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """What a block's store event carries besides its key."""

    parent_hash: bytes | None
    """vLLM's hash of the previous block in the prompt (None for the first block)."""
    token_ids: array[int]
    extra_keys: tuple[Any, ...] | None = None
    """vLLM's extra keys of this block as its events publish them (cache salt, LoRA, ...)."""
    lora_id: int | None = None
    lora_name: str | None = None
