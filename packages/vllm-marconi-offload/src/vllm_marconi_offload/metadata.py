"""The plain plan and report types (`plan.py`) as vLLM's connector metadata types."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from .plan import BlockTransfer, StepPlan, StoreReport, TransferJob

__all__ = ["BlockTransfer", "OffloadMetadata", "TransferJob", "WorkerReport"]


@dataclass
class OffloadMetadata(StepPlan, KVConnectorMetadata):  # type: ignore[misc]
    """A `StepPlan` sent to the workers as vLLM's connector metadata."""

    @classmethod
    def of(cls, plan: StepPlan) -> OffloadMetadata:
        return cls(loads=plan.loads, stores=plan.stores, step=plan.step)


@dataclass
class WorkerReport(StoreReport, KVConnectorWorkerMetadata):  # type: ignore[misc]
    """A `StoreReport` sent back as vLLM's connector worker metadata."""

    def aggregate(self, other: KVConnectorWorkerMetadata) -> WorkerReport:
        assert isinstance(other, WorkerReport)
        merged = self.merged(other)
        return WorkerReport(done=merged.done, step=merged.step)
