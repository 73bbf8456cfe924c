"""The store configuration, derived identically in the scheduler and in every worker.

Both sides must name the same files and agree on their geometry without talking to each
other, so everything here is a pure function of the vLLM config and the connector config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from kvpool_mmap import StoreConfig, remove_stale_l1
from vllm_kv_identity import weights_fingerprint

from . import compat
from .config import USER_KEYS, OffloadConfig
from .layout import LayoutError, SlotLayout

ANONYMOUS_L1_ROOT = "/dev/shm"
ANONYMOUS_L1_PREFIX = "vllm-marconi-offload-"


def layout_fingerprint(vllm_config: Any, layout: SlotLayout, block_size: int) -> bytes:
    """Bytes that change whenever stored KV would no longer be valid for this engine.

    The weights count by content (a new checkpoint or hub snapshot under the same name
    changes them; L2 outlives the process, and only this host reads it).
    """
    model_config = vllm_config.model_config
    revision = compat.model_revision(model_config)
    model = str(model_config.model)
    fields = (
        model,
        weights_fingerprint(model, revision, host_local=True),
        str(revision),
        str(model_config.dtype),
        str(vllm_config.cache_config.cache_dtype),
        block_size,
        vllm_config.parallel_config.tensor_parallel_size,
        layout.digest_fields(),
    )
    return hashlib.blake2b(repr(fields).encode(), digest_size=16).digest()


def engine_name(vllm_config: Any, config: OffloadConfig, fingerprint: bytes) -> str:
    """A name for this engine's files that is stable across restarts (unlike engine_id)."""
    if config.pool_name is not None:
        return config.pool_name  # validated: used as it is, so distinct names never collide
    return f"{_model_slug(vllm_config)}-{fingerprint.hex()[:12]}"


def engine_file_pattern(vllm_config: Any, config: OffloadConfig) -> re.Pattern[str]:
    """The names `engine_name` can give this engine's pool files before the model loads
    (the layout part of the fingerprint is not known yet: any value matches); groups
    `name` (the engine name) and `dp` (the data-parallel rank)."""
    if config.pool_name is not None:
        name = re.escape(config.pool_name)
    else:
        name = re.escape(_model_slug(vllm_config)) + "-[0-9a-f]{12}"
    return re.compile(rf"kvpool-(?P<name>{name})-dp(?P<dp>\d+)-tp\d+\.l[12]")


def _model_slug(vllm_config: Any) -> str:
    model = Path(str(vllm_config.model_config.model)).name or "model"
    return _slug(model)[:40]


def anonymous_l1_root() -> Path:
    """Where the per-engine L1 directories go when `cpu_pool_path` is not set."""
    return Path(ANONYMOUS_L1_ROOT if os.path.isdir(ANONYMOUS_L1_ROOT) else tempfile.gettempdir())


def anonymous_l1_dirs() -> list[Path]:
    """Every engine's anonymous L1 directory (real directories, no links)."""
    root = anonymous_l1_root()
    return [
        folder
        for folder in root.glob(f"{ANONYMOUS_L1_PREFIX}*")
        if folder.is_dir() and not folder.is_symlink()
    ]


def anonymous_l1_dir(vllm_config: Any) -> str:
    """Per-engine-instance tmpfs directory used when `cpu_pool_path` is not set."""
    engine_id = _slug(str(vllm_config.kv_transfer_config.engine_id))
    return str(anonymous_l1_root() / f"{ANONYMOUS_L1_PREFIX}{engine_id}")


def reclaim_anonymous_l1(store_config: StoreConfig) -> None:
    """Before an anonymous L1 is created: remove the L1 files of anonymous pools whose
    engine died before their names were removed, and their directories once empty and
    older than a minute (a younger empty one may be an engine starting up)."""
    mine = Path(store_config.l1.path)
    if mine.parent != anonymous_l1_root() or not mine.name.startswith(ANONYMOUS_L1_PREFIX):
        return
    for folder in anonymous_l1_dirs():
        if folder == mine:
            continue
        with contextlib.suppress(OSError):
            remove_stale_l1(folder)
            if time.time() - folder.stat().st_mtime > 60:
                folder.rmdir()  # fails unless empty


def unlink_anonymous_l1(store_config: StoreConfig) -> None:
    """Remove the names of an anonymous L1 once every process has it mapped.

    The memory stays alive as long as a mapping does, and nothing is left behind in
    /dev/shm when the engine exits, however it exits.
    """
    for rank in range(store_config.tp_size):
        Path(store_config.l1_file(rank)).unlink(missing_ok=True)
        physical_layout_file(store_config, rank).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(store_config.l1.path).rmdir()


def build_store_config(
    vllm_config: Any, config: OffloadConfig, layout: SlotLayout, block_size: int
) -> StoreConfig:
    """The `StoreConfig` every process of this engine derives."""
    fingerprint = layout_fingerprint(vllm_config, layout, block_size)
    parallel = vllm_config.parallel_config
    values = {
        **config.store_values(),
        "stride": layout.stride,
        "engine_id": engine_name(vllm_config, config, fingerprint),
        "fingerprint": fingerprint,
        "l1.path": config.cpu_pool_path or anonymous_l1_dir(vllm_config),
        "dp_size": int(parallel.data_parallel_size),
        "tp_size": int(parallel.tensor_parallel_size),
        "dp_rank": compat.data_parallel_rank(parallel),
    }
    return StoreConfig.from_dict(values, names=USER_KEYS)  # errors in the user's keys


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64] or "x"


# -- the physical layout: seen by the workers, adopted by the scheduler ----------------------
#
# The scheduler never sees the KV tensors, so it cannot tell how their bytes are arranged.
# Each worker writes what it saw next to its L1 file; the scheduler (built after the
# workers registered their caches) reads every rank's copy and mixes it into the
# fingerprint that guards L2, so L2 blocks written under another arrangement are dropped
# at startup instead of being loaded as garbage. The L1 files carry the same fingerprint,
# so opening them verifies that the scheduler adopted what the workers saw.


def physical_layout_file(store_config: StoreConfig, rank: int) -> Path:
    """Where rank `rank` publishes the physical layout of its KV tensors."""
    l1 = Path(store_config.l1_file(rank))
    return l1.with_name(l1.name + ".layout")


def with_physical_layout(store_config: StoreConfig, physical: str) -> StoreConfig:
    """`store_config` whose fingerprint also covers the KV tensors' physical layout."""
    digest = hashlib.blake2b(physical.encode(), digest_size=16).digest()
    return dataclasses.replace(store_config, fingerprint=store_config.fingerprint + digest)


def publish_physical_layout(store_config: StoreConfig, rank: int, physical: str) -> StoreConfig:
    """Worker side, once its L1 file is created (and so locked): write what this rank saw
    (atomically); return the config L1 is opened with (`with_physical_layout`)."""
    path = physical_layout_file(store_config, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(physical)
    tmp.replace(path)
    return with_physical_layout(store_config, physical)


def adopt_physical_layout(store_config: StoreConfig) -> StoreConfig:
    """Scheduler side: the config every rank agreed on; LayoutError if one is missing or
    differs (a store shared by workers that arrange KV differently cannot be correct)."""
    seen: dict[int, str] = {}
    for rank in range(store_config.tp_size):
        path = physical_layout_file(store_config, rank)
        try:
            seen[rank] = path.read_text()
        except FileNotFoundError:
            raise LayoutError(
                f"worker rank {rank} published no KV layout at {path}: every worker must "
                "register its KV caches (on this host) before the scheduler starts"
            ) from None
    if len(set(seen.values())) > 1:
        raise LayoutError(
            "tensor-parallel ranks arrange their KV caches differently: "
            f"{_layout_differences(seen)} "
            f"(see {physical_layout_file(store_config, 0).parent}/*.layout); "
            "offloaded blocks could not be shared between them"
        )
    return with_physical_layout(store_config, seen[0])


def _layout_differences(seen: dict[int, str]) -> str:
    """Each rank that disagrees with rank 0, with the first layer line where it does."""
    reference = seen[0].splitlines()
    found = []
    for rank, text in sorted(seen.items()):
        lines = text.splitlines()
        for index in range(max(len(reference), len(lines))):
            ours = lines[index] if index < len(lines) else "nothing"
            theirs = reference[index] if index < len(reference) else "nothing"
            if ours != theirs:
                found.append(f"rank {rank} has {ours!r} where rank 0 has {theirs!r}")
                break
    return "; ".join(found)
