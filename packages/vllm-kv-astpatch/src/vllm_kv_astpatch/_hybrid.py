"""The hybrid-model patch: let external KV connectors serve Mamba-hybrid models on vLLM 0.22.

vLLM 0.22.1 `Scheduler._mamba_block_aligned_split` starts with
`assert num_external_computed_tokens == 0`; vLLM 0.23.0 removed it and, in
`Scheduler.schedule`, stopped calling the split for a request that only sets up an
asynchronous external load. This patch makes both edits, together or not at all:
removing the assert alone would turn the crash into a scheduler that waits forever
for an asynchronous load it never starts.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from . import _mechanism
from ._mechanism import FunctionTarget, Prepared, SkipError
from ._transforms import guard_split_on_async_load, remove_external_connector_assert

logger = logging.getLogger("vllm_kv_astpatch")

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
SPLIT_QUALNAME = "Scheduler._mamba_block_aligned_split"
SCHEDULE_QUALNAME = "Scheduler.schedule"

SUPPORTED_VLLM = ((0, 22, 1), (0, 23, 0))
"""vLLM versions `[low, high)` whose scheduler this patch was verified against.

A matching assert in any other version is left alone (`skipped-unsupported-version`)."""

DISABLE_ENV = "VLLM_KV_ASTPATCH_DISABLE"
"""Set to anything but `""`, `0`, `false`, `no` or `off` to disable the patch."""

APPLIED = "applied"
NOT_NEEDED = "not-needed"
NOT_APPLIED = "not-applied"
SKIPPED = "skipped-"


class PatchSkipped(UserWarning):
    """Warned once per skip: the patch was not applied, and why."""


@dataclass(frozen=True)
class PatchReport:
    """What one `apply_hybrid_patch` call found and did."""

    target: str
    """`module:qualname` of the function that holds the assert."""
    vllm_version: str | None
    """`vllm.__version__`, or None when vLLM could not be imported."""
    status: str
    """`applied`, `not-needed`, `not-applied` or `skipped-<reason>`."""
    reason: str
    """One human-readable sentence about the status."""
    changed: bool = False
    """Whether this call changed any live function (False on a repeated apply)."""
    patched: tuple[str, ...] = field(default=())
    """`module:qualname` of every function running patched code."""

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for logs and JSON)."""
        return asdict(self)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """`"0.22.1+cpu"` -> `(0, 22, 1)`; None when there is no leading `X.Y`."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if match is None:
        return None
    major, minor, micro = match.groups()
    return int(major), int(minor), int(micro or 0)


def is_disabled(environ: dict[str, str] | None = None) -> bool:
    """Whether `DISABLE_ENV` disables the patch."""
    value = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _installed_vllm_version() -> str | None:
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


class HybridPatch:
    """The patch for one scheduler module; `DEFAULT` targets vLLM's."""

    def __init__(
        self,
        module: str = SCHEDULER_MODULE,
        version_of: Callable[[], str | None] = _installed_vllm_version,
        supported: tuple[tuple[int, int, int], tuple[int, int, int]] = SUPPORTED_VLLM,
    ) -> None:
        self.split = FunctionTarget(module, SPLIT_QUALNAME)
        self.schedule = FunctionTarget(module, SCHEDULE_QUALNAME)
        self._version_of = version_of
        self._supported = supported
        self._lock = threading.RLock()
        self._busy = False
        self._report = PatchReport(str(self.split), None, NOT_APPLIED, "apply() was not called")
        self._installed: tuple[Prepared, ...] = ()

    @property
    def report(self) -> PatchReport:
        """The latest report (`not-applied` before the first apply)."""
        return self._report

    @property
    def status(self) -> str:
        """Shorthand for `report.status`."""
        return self._report.status

    def apply(self) -> PatchReport:
        """Apply once; later calls change nothing and report `changed=False`. Never raises."""
        with self._lock:
            previous = self._report
            if self._busy:  # re-entered from the import of vLLM that apply() started
                return replace(previous, changed=False, reason="apply() is already running")
            if previous.status == APPLIED and all(
                _mechanism.is_patched(p.function) for p in self._installed
            ):
                return replace(previous, changed=False, reason="already applied; nothing changed")
            if previous.status in _FINAL:
                return replace(previous, changed=False)
            self._busy = True
            try:
                report = self._apply(disabled=is_disabled())
            except Exception as exc:  # a bug here must never take vLLM down
                report = self._skip("internal-error", f"{type(exc).__name__}: {exc}", None)
            finally:
                self._busy = False
            return self._finish(report, warn=report.status != SKIPPED + "disabled")

    def revert(self) -> bool:
        """Restore the original code of every patched function; True if any was patched."""
        with self._lock:
            restored = [_mechanism.restore(p.function) for p in self._installed]
            self._installed = ()
            self._report = PatchReport(str(self.split), None, NOT_APPLIED, "reverted")
            return any(restored)

    def _apply(self, *, disabled: bool) -> PatchReport:
        try:
            _mechanism.resolve(self.split)  # imports vLLM outside the process-wide lock
            with _mechanism.lock():  # one decision and install at a time, process-wide
                return self._apply_locked(disabled=disabled)
        except SkipError as skip:
            return self._skip(skip.reason, skip.detail, self._version_of())

    def _apply_locked(self, *, disabled: bool) -> PatchReport:
        split = _mechanism.prepare(self.split, remove_external_connector_assert)
        version = self._version_of()
        if split.patched is None:
            return PatchReport(
                str(self.split), version, NOT_NEEDED, "no external-connector assert in the split"
            )
        if disabled:
            return self._skip(
                "disabled", f"the assert is present but {DISABLE_ENV} is set", version
            )
        low, high = self._supported
        parsed = parse_version(version)
        if parsed is None or not low <= parsed < high:
            return self._skip(
                "unsupported-version",
                f"the assert is present but vLLM {version} is outside the verified range "
                f"{_dotted(low)} <= v < {_dotted(high)}",
                version,
            )
        schedule = _mechanism.prepare(self.schedule, guard_split_on_async_load)
        changed = _mechanism.install([split, schedule])
        self._installed = (split, schedule)
        patched = tuple(str(p.target) for p in self._installed if p.patched is not None)
        if not changed:
            reason = "already applied; nothing changed"
        elif schedule.patched is not None:
            reason = "removed the assert and skipped the split during asynchronous loads"
        else:
            reason = "removed the assert (asynchronous loads were already skipped)"
        return PatchReport(str(self.split), version, APPLIED, reason, changed, patched)

    def _skip(self, reason: str, detail: str, version: str | None) -> PatchReport:
        return PatchReport(str(self.split), version, SKIPPED + reason, detail)

    def _finish(self, report: PatchReport, *, warn: bool) -> PatchReport:
        self._report = report
        if warn and report.status.startswith(SKIPPED):
            warnings.warn(
                f"vllm-kv-astpatch: {report.target} not patched ({report.status}): {report.reason}",
                PatchSkipped,
                stacklevel=3,
            )
        logger.debug("hybrid patch: %s", report)
        return report


_FINAL = frozenset(
    {NOT_NEEDED}
    | {
        SKIPPED + r
        for r in (
            "target-missing",
            "unexpected-target",
            "source-unavailable",
            "parse-error",
            "unexpected-ast",
            "source-mismatch",
            "compile-error",
            "closure-mismatch",
            "unsupported-version",
        )
    }
)
"""Outcomes that another apply in the same process would only repeat."""


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


DEFAULT = HybridPatch()


def apply_hybrid_patch() -> PatchReport:
    """Patch vLLM's scheduler for external KV hits on hybrid models (idempotent, never raises)."""
    return DEFAULT.apply()


def revert_hybrid_patch() -> bool:
    """Undo `apply_hybrid_patch`; True if anything was restored."""
    return DEFAULT.revert()


def patch_report() -> PatchReport:
    """The latest report of `apply_hybrid_patch` (`not-applied` before it)."""
    return DEFAULT.report


def hybrid_external_hits_supported() -> bool:
    """Apply the patch and say whether this vLLM accepts external hits on hybrid models.

    True when the patch is applied or not needed. A connector should report no external
    hits for a model with Mamba layers when this is False.
    """
    return apply_hybrid_patch().status in (APPLIED, NOT_NEEDED)
