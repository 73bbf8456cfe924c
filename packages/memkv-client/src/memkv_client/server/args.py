"""Command-line parsing for `memkv`: each flag's value is checked as it is parsed, so a
bad one is reported in one line naming the flag, the value and the accepted form (exit
status 2), never a usage dump or a traceback."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from kv_offload_settings import parse_size

from ..sockio import parse_address

__all__ = [
    "OneLineParser",
    "address",
    "int_in",
    "listen_address",
    "parse_size",
    "seconds",
    "size",
]

MAX_SECONDS = 86400.0  #: the longest timeout a flag accepts (one day)


class OneLineParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one line, `prog: message`, with exit status 2
    (its subparsers are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """A flag type: an integer in `lo..hi` (no upper bound if `hi` is None)."""
    accepted = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: {accepted}")
        return value

    return parse


def seconds(text: str) -> float:
    """A flag type: a number of seconds in (0, `MAX_SECONDS`]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds in (0, {MAX_SECONDS:g}], e.g. 10 or 0.5"
        )
    return value


def size(text: str) -> str:
    """A flag type: a size `parse_size` accepts (the text is kept, for messages)."""
    try:
        parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _address_type(allow_port_zero: bool) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            parse_address(text, allow_port_zero=allow_port_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (e.g. 127.0.0.1:9900)") from None
        return text

    return parse


listen_address = _address_type(allow_port_zero=True)  #: `host:port`, port 0 = any
address = _address_type(allow_port_zero=False)  #: `host:port` of a server
