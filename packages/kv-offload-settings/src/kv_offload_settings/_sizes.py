"""One size rule for every package and CLI: `parse_size`."""

from __future__ import annotations

import math
import re

import bitmath

__all__ = ["SIZE_EXAMPLES", "parse_size"]

SIZE_EXAMPLES = "8GiB, 8GB, 8G or 8589934592 (all binary: 1 GB = 2^30 bytes)"
_UNIT = re.compile(r"(?P<number>.*?)\s*(?P<unit>[A-Za-z]*)")


def parse_size(text: str) -> int:
    """Bytes in a size such as `8GiB`, `8GB`, `8G`, `8gib`, `8GIB` or `8589934592`.

    bitmath parses it, every unit binary (K, KB and KiB all mean 2^10) and case-blind,
    except that a lone lowercase `b` means bits. ValueError if `text` is no size
    (negative, bits, or not a whole number of bytes).
    """
    match = _UNIT.fullmatch(text.strip())
    size = math.nan
    if match is not None:
        unit = match["unit"] if match["unit"] == "B" else match["unit"].lower()
        try:
            parsed = bitmath.parse_string(match["number"] + unit, system=bitmath.NIST, strict=False)
            size = math.nan if isinstance(parsed, bitmath.Bit) else float(parsed.bytes)
        except ValueError:
            pass
    if not math.isfinite(size) or size < 0 or not size.is_integer():
        raise ValueError(f"{text!r} is not a size such as {SIZE_EXAMPLES}")
    return int(size)
