"""Validate `kv_connector_extra_config` in the process the user started, before vLLM
starts the engine core and its workers.

vLLM builds the connector only inside the engine core and the workers, after they have
started (tens of seconds), and a bad key there surfaces as several worker and engine-core
tracebacks. vLLM has no hook that sees the finished configuration earlier, so the plugin
wraps `EngineArgs.create_engine_config`, the public method that every entry point
(`vllm serve`, the OpenAI server, `LLM(...)`, `AsyncLLM`) calls to build it: a bad key
then stops the program there, once, with our message. If nothing catches it (`vllm
serve`, a script), the program ends with that message as one line on stderr, not a
traceback: the first error a user sees names the key, the value and the accepted form.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import TracebackType
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
_WRAPPED = "_marconi_offload_checks_config"
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

    original = EngineArgs.create_engine_config
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        try:
            config = check_vllm_config(vllm_config)
        except ConfigError:
            _report_in_one_line()
            raise
        if config is not None and config.cpu_pool_path:  # anonymous L1s lose their names
            remove_l1_at_exit(Path(config.cpu_pool_path), engine_file_pattern(vllm_config, config))
        return vllm_config

    setattr(create_engine_config, _WRAPPED, True)
    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]


def _report_in_one_line() -> None:
    """Make an uncaught ConfigError end the program with one line on stderr (other
    exceptions still go to the hook that was there)."""
    previous = sys.excepthook
    if getattr(previous, _WRAPPED, False):
        return

    def excepthook(
        kind: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> None:
        if isinstance(error, ConfigError):
            print(
                f"ERROR {CONNECTOR_NAME}: bad kv_connector_extra_config: {error}", file=sys.stderr
            )
        else:
            previous(kind, error, tb)

    setattr(excepthook, _WRAPPED, True)
    sys.excepthook = excepthook
