"""`marconi`: evict the leaf block with the lowest reuse x exp(-decay x age) / (depth + 1).

`reuse` comes from the key's use count (1 on insert, +1 per `touch`) by `reuse_mode`:
`linear` = count, `log` = log1p(count), `none` = 1. `age` is the number of ticks since
the key was inserted or last touched. Ties go to the least recently used key.

Scores are never recomputed as time passes: at tick `now`,

    log(score) = log(reuse / (depth + 1)) + decay x last_touch - decay x now

and the last term is common to every key, so the order is fixed by the first two,
computed once per insert or touch. Ordering in log space is also exact where the
direct formula would underflow to 0 (age above ~745 / decay).
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Hashable
from typing import Any

from .chainheap import SEQ_BITS, SLOT_BITS, SLOT_MASK, ChainHeapPolicy
from .policy import reject_unknown_options

__all__ = ["REUSE_MODES", "MarconiPolicy"]

REUSE_MODES = ("linear", "log", "none")
_SIGN = 1 << 63
_MASK64 = (1 << 64) - 1
_DOUBLE = struct.Struct("<d")
_UINT64 = struct.Struct("<Q")


def float_order_bits(x: float) -> int:
    """A non-negative int that orders exactly like the float `x` (no NaN)."""
    (u,) = _UINT64.unpack(_DOUBLE.pack(x))
    result: int = (_MASK64 - u) if u & _SIGN else (u | _SIGN)
    return result


def float_from_order_bits(u: int) -> float:
    """Inverse of `float_order_bits`."""
    bits = (u ^ _SIGN) if u & _SIGN else (_MASK64 - u)
    (x,) = _DOUBLE.unpack(_UINT64.pack(bits))
    result: float = x
    return result


def validate_marconi_options(decay: object, reuse_mode: object) -> float:
    """Check Marconi options; return `decay` as a float. Raises `ValueError`."""
    if reuse_mode not in REUSE_MODES:
        raise ValueError(
            f"option 'reuse_mode' must be one of {', '.join(REUSE_MODES)}; got {reuse_mode!r}"
        )
    if isinstance(decay, bool) or not isinstance(decay, int | float):
        raise ValueError(f"option 'decay' must be a finite number >= 0; got {decay!r}")
    value = float(decay)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"option 'decay' must be a finite number >= 0; got {decay!r}")
    return value


class MarconiPolicy(ChainHeapPolicy):
    """Reuse- and depth-aware scores with exponential decay over ticks."""

    name = "marconi"

    def __init__(self, *, decay: float = 0.0, reuse_mode: str = "linear") -> None:
        super().__init__()
        self.decay = validate_marconi_options(decay, reuse_mode)
        self.reuse_mode = reuse_mode
        self._uses = array("I")
        self._depth = array("I")

    def score(self, key: Hashable) -> float:
        """The key's current score reuse x exp(-decay x age) / (depth + 1)."""
        item = self._lookup(key)
        priority = (item >> SLOT_BITS) - self._retention_offset(item & SLOT_MASK)
        log_key = float_from_order_bits(priority >> SEQ_BITS)
        return math.exp(log_key - self.decay * self._now)

    def uses(self, key: Hashable) -> int:
        """Insert plus hits of `key`."""
        return self._uses[self._lookup(key) & SLOT_MASK]

    def _grow(self) -> None:
        self._uses.append(0)
        self._depth.append(0)

    def _log_key(self, slot: int) -> float:
        uses = self._uses[slot]
        mode = self.reuse_mode
        if mode == "linear":
            reuse = float(uses)
        elif mode == "log":
            reuse = math.log1p(uses)
        else:
            reuse = 1.0
        return math.log(reuse / (self._depth[slot] + 1)) + self.decay * self._now

    def _priority_on_insert(self, slot: int, depth: int, seq: int) -> int:
        self._uses[slot] = 1
        self._depth[slot] = depth
        return (float_order_bits(self._log_key(slot)) << SEQ_BITS) | seq

    def _priority_on_touch(self, slot: int, seq: int) -> int:
        uses = self._uses[slot]
        if uses < 0xFFFFFFFF:
            self._uses[slot] = uses + 1
        return (float_order_bits(self._log_key(slot)) << SEQ_BITS) | seq


def build(**options: Any) -> MarconiPolicy:
    reject_unknown_options("marconi", options, ("decay", "reuse_mode"))
    return MarconiPolicy(**options)
