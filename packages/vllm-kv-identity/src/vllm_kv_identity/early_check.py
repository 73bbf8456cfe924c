"""Check a plugin's settings where the user's program builds vLLM's configuration, so a
bad value is the first error, in one line, seconds after start.

vLLM builds connectors, offloading specs and secondary tiers only inside the engine core
and its workers, after they have started, and an error there surfaces wrapped in several
tracebacks. No vLLM hook sees the finished configuration earlier, so
`check_at_config_build` wraps `EngineArgs.create_engine_config`, the public method every
entry point (`vllm serve`, the OpenAI server, `LLM(...)`, `AsyncLLM`) calls to build it.
If nothing catches the error (`vllm serve`, a script), the program ends with the one line
`report(error)` on stderr instead of a traceback. No vLLM import: the caller passes the
class in. The one probe of vLLM's method is `_checks_on` (the tags of the checks already
wrapped around it), so two plugins, or one loaded twice, chain their checks instead of
wrapping twice.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["check_at_config_build"]

_CHECKS = "_kv_plugin_config_checks"  # tags of the checks a wrapper runs


def check_at_config_build(
    engine_args_cls: Any,
    tag: str,
    check: Callable[[Any], None],
    errors: tuple[type[BaseException], ...],
    report: Callable[[BaseException], str] = str,
) -> None:
    """Make `engine_args_cls.create_engine_config` run `check(vllm_config)` on the config
    it built (idempotent per `tag`); an uncaught one of `errors` from it ends the program
    with the line `report(error)` on stderr."""
    original = engine_args_cls.create_engine_config
    if tag in _checks_on(original):
        return

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        try:
            check(vllm_config)
        except errors:
            _end_in_one_line(tag, errors, report)
            raise
        return vllm_config

    setattr(create_engine_config, _CHECKS, _checks_on(original) | {tag})
    engine_args_cls.create_engine_config = create_engine_config


def _checks_on(hooked: Any) -> frozenset[str]:
    """The tags of the checks `hooked` (vLLM's `create_engine_config` or `sys.excepthook`)
    already runs: none unless one of our wrappers replaced it."""
    return frozenset(getattr(hooked, _CHECKS, ()))


def _end_in_one_line(
    tag: str, errors: tuple[type[BaseException], ...], report: Callable[[BaseException], str]
) -> None:
    previous = sys.excepthook
    if tag in _checks_on(previous):
        return

    def excepthook(
        kind: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> None:
        if isinstance(error, errors):
            print(report(error), file=sys.stderr)
        else:
            previous(kind, error, tb)

    setattr(excepthook, _CHECKS, _checks_on(previous) | {tag})
    sys.excepthook = excepthook
