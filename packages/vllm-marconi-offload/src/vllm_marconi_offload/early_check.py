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
from types import TracebackType
from typing import Any

from .config import ConfigError, OffloadConfig

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
    module = getattr(kv_transfer_config, "kv_connector_module_path", None) or ""
    return bool(
        getattr(kv_transfer_config, "kv_connector", None) == CONNECTOR_NAME
        or module.split(".")[0] == "vllm_marconi_offload"
    )


def check_vllm_config(vllm_config: Any) -> None:
    """ConfigError if this connector is selected with a bad `kv_connector_extra_config`."""
    kv_transfer_config: Any = getattr(vllm_config, "kv_transfer_config", None)
    if _offloading_flag_set(vllm_config) and _meant_for_us(kv_transfer_config):
        raise ConfigError(ONE_FLAG_ERROR)
    if uses_this_connector(kv_transfer_config):
        OffloadConfig.from_extra_config(kv_transfer_config.kv_connector_extra_config)


def _offloading_flag_set(vllm_config: Any) -> bool:
    return (
        getattr(getattr(vllm_config, "cache_config", None), "kv_offloading_size", None) is not None
    )


def _meant_for_us(kv_transfer_config: Any) -> bool:
    """Our module path, or settings only this connector takes (the flag replaced the name)."""
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
    return uses_this_connector(kv_transfer_config) or any(key in extra for key in _OWN_KEYS)


def install() -> None:
    """Make `EngineArgs.create_engine_config` check our config (idempotent)."""
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        try:
            check_vllm_config(vllm_config)
        except ConfigError:
            _report_in_one_line()
            raise
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
