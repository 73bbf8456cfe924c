"""Plain data that crosses from the scheduler process to the workers and back."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass(frozen=True)
class BlockTransfer:
    """Blocks of one KV-cache group paired with L1 slots, in the same order."""

    group_id: int
    gpu_blocks: tuple[int, ...]
    slots: tuple[int, ...]


@dataclass(frozen=True)
class TransferJob:
    """One request's load (L1 -> GPU) or store (GPU -> L1) for one step."""

    job_id: int
    req_id: str
    transfers: tuple[BlockTransfer, ...]


@dataclass
class OffloadMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """What the workers do this step: loads before the forward, stores after it."""

    loads: list[TransferJob] = field(default_factory=list)
    stores: list[TransferJob] = field(default_factory=list)


@dataclass
class StoreCompletions(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Store jobs a worker has finished, counted over all workers of the engine."""

    done: Counter[int] = field(default_factory=Counter)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> StoreCompletions:
        assert isinstance(other, StoreCompletions)
        return StoreCompletions(done=self.done + other.done)
