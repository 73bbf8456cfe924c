"""`check_at_config_build`: a plugin's check runs on every config vLLM builds, once per
plugin, and an uncaught error from it ends the program with one line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from vllm_kv_identity.early_check import check_at_config_build


class _EngineArgs:
    def create_engine_config(self) -> dict[str, Any]:
        return {"ok": True}


def test_the_check_runs_on_each_built_config_once_per_tag() -> None:
    seen: list[Any] = []
    for _ in range(2):  # a plugin loaded twice wraps once
        check_at_config_build(_EngineArgs, "a", seen.append, (ValueError,))
    check_at_config_build(_EngineArgs, "b", seen.append, (ValueError,))
    assert _EngineArgs().create_engine_config() == {"ok": True}
    assert seen == [{"ok": True}, {"ok": True}]


def test_an_uncaught_error_ends_the_program_in_one_line() -> None:
    script = textwrap.dedent(
        """
        from vllm_kv_identity.early_check import check_at_config_build

        class EngineArgs:
            def create_engine_config(self):
                return {}

        def check(config):
            raise ValueError("plugin: key 'x': got 1; accepted: 2")

        check_at_config_build(EngineArgs, "p", check, (ValueError,), lambda e: f"ERROR {e}")
        EngineArgs().create_engine_config()
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr == "ERROR plugin: key 'x': got 1; accepted: 2\n"


def test_other_errors_keep_their_traceback() -> None:
    def check(config: Any) -> None:
        raise KeyError("not ours")

    class Args(_EngineArgs):
        pass

    check_at_config_build(Args, "c", check, (ValueError,))
    with pytest.raises(KeyError):
        Args().create_engine_config()
