"""Retention hints: how long a block should stay cached relative to others.

A caller that knows more than the access pattern (a system prompt every session shares,
a one-shot or sensitive prompt) passes a `Retention` with `EvictionPolicy.insert`. The
heap policies order every `HIGH` key after every `NORMAL` key and every `LOW` key before
them; within one class a policy's own order is unchanged. Storage layers read `LOW` as
"not worth writing to slower tiers" (kvpool-mmap never writes such a block to L2).
"""

from __future__ import annotations

import enum

__all__ = ["RETENTION_NAMES", "Retention", "parse_retention"]


class Retention(enum.IntEnum):
    """Retention class of a cached block; `NORMAL` unless a caller says otherwise."""

    LOW = 0
    """Evicted before every normal block; never written to a slower tier."""
    NORMAL = 1
    HIGH = 2
    """Evicted only when no normal or low block can be."""


RETENTION_NAMES = tuple(r.name.lower() for r in Retention)
"""The accepted spellings of `parse_retention`: low, normal, high."""


def parse_retention(value: object, key: str = "retention") -> Retention:
    """The `Retention` named `value` ("low", "normal" or "high").

    Raises `ValueError` naming `key`, the value and the accepted names.
    """
    if isinstance(value, str) and value in RETENTION_NAMES:
        return Retention[value.upper()]
    raise ValueError(f"{key} must be one of {', '.join(RETENTION_NAMES)}; got {value!r}")
