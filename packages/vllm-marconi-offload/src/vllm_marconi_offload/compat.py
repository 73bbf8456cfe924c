"""Every difference between the vLLM releases we support (`SUPPORTED_VLLM`), in one place.

Each helper detects features, not version numbers, where the feature can be seen; the
supported range is checked once at start.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from vllm_kv_identity import unsupported_vllm

from ._version import SUPPORTED_VLLM

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


def vllm_version() -> str:
    """The running vLLM's version (`vllm.__version__`; the CPU wheel has other metadata)."""
    import vllm

    return str(vllm.__version__)


def check_supported(version: str) -> str | None:
    """A warning if vLLM `version` is outside `SUPPORTED_VLLM`, else None."""
    return unsupported_vllm("vllm-marconi-offload", SUPPORTED_VLLM, version)


def scheduler_block_size(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> int:
    """Tokens per block as the scheduler hashes them (`hash_block_size` where present)."""
    hash_block_size = getattr(kv_cache_config, "hash_block_size", None)
    if hash_block_size:
        return int(hash_block_size)
    return int(vllm_config.cache_config.block_size)


def hash_algorithm(vllm_config: VllmConfig) -> str:
    return str(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256"))


def cached_requests(
    scheduler_output: SchedulerOutput,
) -> Iterator[tuple[str, tuple[list[int], ...] | None, int, bool]]:
    """(req_id, new block ids, num computed tokens, resumed from preemption) per cached request.

    0.27-0.31 flag resumption with a list `resumed_from_preemption`; newer releases keep a
    set `resumed_req_ids`.
    """
    cached = scheduler_output.scheduled_cached_reqs
    resumed_ids = getattr(cached, "resumed_req_ids", None)
    resumed_flags = getattr(cached, "resumed_from_preemption", None)
    for i, req_id in enumerate(cached.req_ids):
        if resumed_ids is not None:
            resumed = req_id in resumed_ids
        else:
            resumed = bool(resumed_flags[i]) if resumed_flags is not None else False
        yield req_id, cached.new_block_ids[i], cached.num_computed_tokens[i], resumed


def attention_waits_per_layer(forward_context: ForwardContext) -> bool:
    """True if this step's forward will call the connector's `wait_for_layer_load` before
    each attention layer (as far as the forward context tells).

    vLLM calls it from each attention layer it runs eagerly, where the forward context
    carries attention metadata: every layer of a step run without CUDA graphs or as a
    piecewise graph, none of a step replayed as one full graph (runtime mode FULL). A
    forward context without metadata or runtime mode (vLLM's V2 model runner) says nothing:
    False.
    """
    if getattr(forward_context, "attn_metadata", None) is None:
        return False
    mode = getattr(forward_context, "cudagraph_runtime_mode", None)
    return mode is not None and getattr(mode, "name", "FULL") != "FULL"


def worker_meta(connector_output: KVConnectorOutput) -> Any:
    """What the workers reported with this step's output (`kv_connector_worker_meta`),
    None where the release does not carry it."""
    return getattr(connector_output, "kv_connector_worker_meta", None)


def transfer_params(request: Request) -> dict[str, Any] | None:
    """The request's `kv_transfer_params` (None: not given)."""
    params: dict[str, Any] | None = getattr(request, "kv_transfer_params", None)
    return params


def tensor_parallel_rank() -> int:
    """This worker's tensor-parallel rank."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def rank_zero_choice(choice: str) -> str:
    """Tensor-parallel rank 0's `choice`, on every rank (a broadcast over vLLM's
    tensor-parallel group, so every rank must call it, and at the same point)."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return choice
    return str(group.broadcast_object(choice, src=0))


def pythonhashseed() -> str | None:
    return os.environ.get("PYTHONHASHSEED")


# --- KV events (`kv_events.py` builds them) ----------------------------------------------


def disk_medium() -> str:
    """vLLM's event medium for local disk: `STORAGE` (0.27.1+), `FS` (0.26, as its own
    file tier)."""
    from vllm.distributed import kv_events

    return str(getattr(kv_events, "MEDIUM_STORAGE", None) or kv_events.MEDIUM_FS)


def events_enabled(vllm_config: VllmConfig) -> bool:
    """Whether this engine publishes KV events (`--kv-events-config`)."""
    config = getattr(vllm_config, "kv_events_config", None)
    return bool(config is not None and config.enable_kv_cache_events)


@functools.cache
def _event_fields(kind: str) -> frozenset[str]:
    from vllm.distributed import kv_events

    return frozenset(getattr(kv_events, kind).__struct_fields__)


def stored_event(fields: Mapping[str, Any]) -> BlockStored:
    """vLLM's `BlockStored` with those of `fields` this release declares (0.27.1 adds
    `group_idx`, `kv_cache_spec_kind` and `locality`; 0.29 `ownership`; 0.32
    `session_id`)."""
    from vllm.distributed.kv_events import BlockStored

    declared = _event_fields("BlockStored")
    return BlockStored(**{k: v for k, v in fields.items() if k in declared})


def removed_event(fields: Mapping[str, Any]) -> BlockRemoved:
    """vLLM's `BlockRemoved` with those of `fields` this release declares."""
    from vllm.distributed.kv_events import BlockRemoved

    declared = _event_fields("BlockRemoved")
    return BlockRemoved(**{k: v for k, v in fields.items() if k in declared})


def event_extra_keys(extra: list[Any]) -> Any:
    """A run of blocks' extra keys as vLLM's store events publish them: untagged (0.32+,
    where they are tagged in the hash), else as they are (None if every block has none)."""
    from vllm.v1.core import kv_cache_utils

    untag = getattr(kv_cache_utils, "to_event_extra_keys", None)
    if untag is not None:
        return untag(extra)
    return extra if any(e is not None for e in extra) else None


# --- the engine's configuration (early checks, pool names) --------------------------------


def transfer_config(vllm_config: Any) -> Any:
    """`vllm_config.kv_transfer_config` (None: no connector configured)."""
    return getattr(vllm_config, "kv_transfer_config", None)


def connector_choice(kv_transfer_config: Any) -> tuple[str | None, str]:
    """The connector `kv_transfer_config` names and its module path ("" if none)."""
    name = getattr(kv_transfer_config, "kv_connector", None)
    return name, getattr(kv_transfer_config, "kv_connector_module_path", None) or ""


def connector_extra_config(kv_transfer_config: Any) -> dict[str, Any]:
    """`kv_connector_extra_config` ({} if none)."""
    extra: dict[str, Any] = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
    return extra


def offloading_flag_set(vllm_config: Any) -> bool:
    """Whether vLLM's one-flag offload (`--kv-offloading-size`, newer releases) is on."""
    cache = getattr(vllm_config, "cache_config", None)
    return getattr(cache, "kv_offloading_size", None) is not None


def single_host(vllm_config: Any) -> Any:
    """The engine's parallel config if all its ranks run on this host (`nnodes` 1, or a
    release without it), else None."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None or int(getattr(parallel, "nnodes", 1) or 1) != 1:
        return None
    return parallel


def data_parallel(parallel: Any) -> tuple[int, int, int]:
    """(data-parallel size, engines on this host, this host's first data-parallel rank);
    a release or launch without the local fields: every rank on this host."""
    size = max(1, int(getattr(parallel, "data_parallel_size", 1) or 1))
    local = int(getattr(parallel, "data_parallel_size_local", size) or 0)
    return size, local, data_parallel_rank(parallel)


def data_parallel_rank(parallel: Any) -> int:
    """This engine's data-parallel rank (0 without one)."""
    return int(getattr(parallel, "data_parallel_rank", 0) or 0)


def model_revision(model_config: Any) -> str | None:
    """The model's hub revision, None if not pinned."""
    revision: str | None = getattr(model_config, "revision", None)
    return revision
