"""Plain data that crosses from the scheduler process to the workers and back.

No vLLM here, so the scheduler plans and tests without it; `metadata.py` wraps these
types in vLLM's connector metadata types.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


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
    same_step: bool = False
    """A load the forward of the same step waits for (vLLM's synchronous path): reported
    done in `StoreReport.done`, like a store, not as a finished receive."""


@dataclass
class StepPlan:
    """What the workers do this step: loads before the forward, stores after it."""

    loads: list[TransferJob] = field(default_factory=list)
    stores: list[TransferJob] = field(default_factory=list)
    step: int = -1
    """The scheduler's number for this step; the workers report it back once it ran."""


@dataclass
class StoreReport:
    """What the workers report after a step: the store jobs and same-step load jobs they
    finished (counted over all workers of the engine) and the last step they ran (-1: none
    yet)."""

    done: Counter[int] = field(default_factory=Counter)
    step: int = -1

    def merged(self, other: StoreReport) -> StoreReport:
        """Both reports as one (finished counts add up; the later step wins)."""
        return StoreReport(done=self.done + other.done, step=max(self.step, other.step))
