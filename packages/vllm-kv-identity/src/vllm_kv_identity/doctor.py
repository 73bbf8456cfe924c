"""The checklist both plugins' `doctor` commands print, and the command line they share.

A plugin's doctor checks a host before a server starts, from the same configuration the
server would take, and prints one line per finding:

    ✔ what holds
    ⚠ what a server would start with, but not as meant  → the fix
    ✖ what would stop a server                           → the fix

`report` prints the list and returns the exit status: 1 if any finding is ✖, else 0.
`doctor_parser` and `extra_config` read the plugin's configuration from the command line
as vLLM's `--kv-transfer-config` takes it. Standard library only; nothing imports vLLM.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["Check", "Status", "doctor_parser", "extra_config", "human_bytes", "render", "report"]


class Status(enum.Enum):
    """How a finding bears on a server's start."""

    OK = "✔"
    WARN = "⚠"
    """The server would start, but not as meant (slower, or no reuse across restarts)."""
    FAIL = "✖"
    """The server would fail to start, or its first requests would."""


@dataclass(frozen=True)
class Check:
    """One finding: its status, what was found (one line), and what to do about it (empty
    for `Status.OK`)."""

    status: Status
    finding: str
    fix: str = ""

    @classmethod
    def ok(cls, finding: str) -> Check:
        return cls(Status.OK, finding)

    @classmethod
    def warn(cls, finding: str, fix: str) -> Check:
        return cls(Status.WARN, finding, fix)

    @classmethod
    def fail(cls, finding: str, fix: str) -> Check:
        return cls(Status.FAIL, finding, fix)


def human_bytes(n: int) -> str:
    """`n` bytes in binary units, e.g. `4 GiB`, `1.5 MiB`, `512 bytes`."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    text = f"{value:.1f}".removesuffix(".0") if unit != "bytes" else str(n)
    return f"{text} {unit}"


def render(checks: Iterable[Check]) -> str:
    """One line per check: its mark, the finding and, unless it passed, `→ fix`."""
    lines = []
    for check in checks:
        line = f"{check.status.value} {check.finding}"
        if check.fix and check.status is not Status.OK:
            line += f"  → {check.fix}"
        lines.append(line)
    return "\n".join(lines)


def report(title: str, checks: Sequence[Check], out: TextIO | None = None) -> int:
    """Print `title`, the checklist and a count; return 1 if any check failed, else 0."""
    stream = out or sys.stdout
    failed = sum(c.status is Status.FAIL for c in checks)
    warned = sum(c.status is Status.WARN for c in checks)
    print(title, file=stream)
    print(render(checks), file=stream)
    verdict = "a server would fail to start" if failed else "a server can start"
    print(f"{len(checks) - failed - warned} ok, {warned} warning(s), {failed} failure(s): "
          f"{verdict}", file=stream)  # fmt: skip
    return 1 if failed else 0


def doctor_parser(prog: str, description: str, config_help: str) -> argparse.ArgumentParser:
    """The arguments every plugin's doctor takes: the configuration as a server takes it
    (`--kv-transfer-config` JSON, or only its `kv_connector_extra_config`; `--config`, a
    config file as the plugin reads it), vLLM's `--prefix-caching-hash-algo`, and the
    deadline of each network probe."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    given = parser.add_mutually_exclusive_group()
    given.add_argument(
        "--kv-transfer-config",
        metavar="JSON",
        help="the JSON given to vLLM's --kv-transfer-config",
    )
    given.add_argument(
        "--extra-config",
        metavar="JSON",
        help="only its kv_connector_extra_config (a JSON object)",
    )
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.add_argument(
        "--prefix-caching-hash-algo",
        metavar="ALGO",
        default=None,
        help="as given to vLLM (default: vLLM's, sha256)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="deadline of each network probe (default: %(default)s)",
    )
    return parser


def extra_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """`kv_connector_extra_config` from `--kv-transfer-config` or `--extra-config` ({} if
    neither is given); a value that is not a JSON object ends the program through
    `parser.error` (exit status 2), naming the flag."""
    flag, text = (
        ("--kv-transfer-config", args.kv_transfer_config)
        if args.kv_transfer_config is not None
        else ("--extra-config", args.extra_config)
    )
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        parser.error(f"{flag}: not valid JSON: {exc}")
    if not isinstance(value, dict):
        parser.error(f"{flag}: must be a JSON object, got {type(value).__name__}")
    if flag == "--extra-config":
        return value
    extra = value.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        parser.error(f"{flag}: kv_connector_extra_config must be a JSON object")
    return extra
