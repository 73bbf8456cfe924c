"""`ConfigError`, the one configuration error, and the parts of its message.

Every package's configuration errors are, or derive from, `ConfigError`, and read the
same way, in one line: where (the file, if a file gave the value, and the key), the
problem, the accepted values, and for a misspelt key the nearest accepted one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["ConfigError", "did_you_mean", "unknown_keys_message"]


class ConfigError(ValueError):
    """A setting is invalid; the message says where it was set, the key, the problem and
    what is accepted, in one line."""


def did_you_mean(word: str, accepted: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the accepted word nearest `word`, or "" if none is near."""
    near = difflib.get_close_matches(word, list(accepted), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown_keys_message(unknown: Iterable[str], accepted: Iterable[str]) -> str:
    """`unknown key(s) ['x'] (did you mean 'y'?); accepted keys: [...]`."""
    names, known = sorted(unknown), sorted(accepted)
    hints = "".join(did_you_mean(name, known) for name in names)
    return f"unknown key(s) {names}{hints}; accepted keys: {known}"
