"""Validate `kv_connector_extra_config` in the process the user started, before vLLM
starts the engine core and its workers.

vLLM builds the connector only inside the engine core and the workers, after they have
started (tens of seconds), and a bad key there surfaces as several worker and engine-core
tracebacks. `install` hooks `check_vllm_config` into `EngineArgs.create_engine_config`
through `vllm_kv_identity.early_check` (the hook memkv-vllm shares): a bad key then stops
the program there, once, with our message. If nothing catches it (`vllm serve`, a
script), the program ends with that message as one line on stderr, not a traceback: the
first error a user sees names the key, the value and the accepted form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpool_mmap import (
    InsufficientSpaceError,
    KvPoolError,
    check_l1_room,
    inspect_pool_file,
    pool_files,
)

from . import compat
from .config import ConfigError, OffloadConfig
from .exit_cleanup import remove_l1_at_exit
from .pool import anonymous_l1_dirs, anonymous_l1_root, engine_file_pattern

CONNECTOR_NAME = "MarconiOffloadConnector"
ONE_FLAG_ERROR = (
    '--kv-offloading-backend/--kv-offloading-size replace "kv_connector" with vLLM\'s own '
    "OffloadingConnector, which vllm_marconi_offload is not: drop those two flags and select "
    f'"kv_connector": "{CONNECTOR_NAME}" in --kv-transfer-config'
)
"""vLLM's one-flag offload swaps the connector for its own; this package cannot ride on it."""
_OWN_KEYS = ("cpu_pool_path", "l2_pool_path", "config_file")


def uses_this_connector(kv_transfer_config: Any) -> bool:
    """True if `kv_transfer_config` selects this connector (by name or module path)."""
    if kv_transfer_config is None:
        return False
    name, module = compat.connector_choice(kv_transfer_config)
    return name == CONNECTOR_NAME or module.split(".")[0] == "vllm_marconi_offload"


def check_vllm_config(vllm_config: Any) -> OffloadConfig | None:
    """This connector's settings if it is selected, else None; ConfigError if they are bad
    (or, on one host, its pool is in use or does not fit)."""
    kv_transfer_config = compat.transfer_config(vllm_config)
    if compat.offloading_flag_set(vllm_config) and _meant_for_us(kv_transfer_config):
        raise ConfigError(ONE_FLAG_ERROR)
    if not uses_this_connector(kv_transfer_config):
        return None
    config = OffloadConfig.from_extra_config(kv_transfer_config.kv_connector_extra_config)
    parallel = compat.single_host(vllm_config)
    if parallel is not None:  # (ranks on several hosts: each worker checks its own)
        _check_pools_free(vllm_config, config, _local_dp_ranks(parallel))
        _check_l1_room(config, _local_dp_ranks(parallel), parallel)
    return config


def _local_dp_ranks(parallel: Any) -> range:
    """The data-parallel ranks this host's engines run (all of them unless launched apart)."""
    data_parallel, local, first = compat.data_parallel(parallel)
    return range(first, first + min(local, data_parallel))


def _check_pools_free(vllm_config: Any, config: OffloadConfig, dp_ranks: range) -> None:
    """ConfigError if a running process holds a pool file this engine would take (another
    server of the same model, or the same `pool_name`, on the same directories): the
    workers would fail after the model loads, each with its own traceback. Without a
    `pool_name`, a file of the same model under any layout counts (the layout is not known
    before the model loads)."""
    pattern = engine_file_pattern(vllm_config, config)
    for setting, folder in (
        ("cpu_pool_path", config.cpu_pool_path),
        ("l2_pool_path", config.l2_pool_path),
    ):
        if not folder or not Path(folder).is_dir():
            continue
        for path in pool_files(Path(folder)):
            match = pattern.fullmatch(path.name)
            if match is None or int(match["dp"]) not in dp_ranks:
                continue
            try:
                held = inspect_pool_file(path)
            except (KvPoolError, OSError):
                continue
            if held.owners:
                raise ConfigError(
                    f"{config.where(setting)}{setting}: {path} is in use by {held.owner}; "
                    "nothing was changed. Every running engine needs its own pool_name "
                    f"(now {match['name']!r}) or its own {setting}."
                )


def _check_l1_room(config: OffloadConfig, dp_ranks: range, parallel: Any) -> None:
    """ConfigError if this host's share of `cpu_bytes_to_use` cannot fit where its L1
    files go (the workers would fail later, each with its own traceback)."""
    data_parallel, _, _ = compat.data_parallel(parallel)
    share = config.cpu_bytes_to_use * len(dp_ranks) // data_parallel
    if config.cpu_pool_path:
        directory, also = Path(config.cpu_pool_path), []
    else:
        directory, also = anonymous_l1_root(), anonymous_l1_dirs()
    try:
        check_l1_room(directory, share, "cpu_bytes_to_use", also=also)
    except InsufficientSpaceError as exc:
        hint = (
            " (in Docker: docker run --shm-size)" if str(directory).startswith("/dev/shm") else ""
        )
        raise ConfigError(f"{config.where('cpu_bytes_to_use')}{exc.strerror}{hint}") from exc


def _meant_for_us(kv_transfer_config: Any) -> bool:
    """Our module path, or settings only this connector takes (the flag replaced the name)."""
    extra = compat.connector_extra_config(kv_transfer_config)
    return uses_this_connector(kv_transfer_config) or any(key in extra for key in _OWN_KEYS)


def install() -> None:
    """Make `EngineArgs.create_engine_config` check our config, and the process that
    calls it remove the engine's L1 files at its exit (`exit_cleanup`; idempotent)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm_kv_identity.early_check import check_at_config_build

    check_at_config_build(
        EngineArgs, "vllm-marconi-offload", _check_and_clean_at_exit, (ConfigError,), _one_line
    )


def _check_and_clean_at_exit(vllm_config: Any) -> None:
    """`check_vllm_config`; a named L1 of ours is then removed at this process's exit
    (anonymous L1s lose their names on their own)."""
    config = check_vllm_config(vllm_config)
    if config is not None and config.cpu_pool_path:
        remove_l1_at_exit(Path(config.cpu_pool_path), engine_file_pattern(vllm_config, config))


def _one_line(error: BaseException) -> str:
    return f"ERROR {CONNECTOR_NAME}: bad kv_connector_extra_config: {error}"
