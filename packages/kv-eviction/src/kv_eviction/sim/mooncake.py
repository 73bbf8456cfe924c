"""Reader for Mooncake-format JSONL traces (`timestamp`, `input_length`, `hash_ids`)."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import IO

from .trace import Request, Trace

__all__ = ["MOONCAKE_BLOCK_SIZE", "read_mooncake"]

MOONCAKE_BLOCK_SIZE = 512
_BUNDLED = "mooncake_synthetic_trace.jsonl.gz"


def _open(path: str | Path | None) -> IO[str]:
    if path is None:
        raw = resources.files("kv_eviction.sim").joinpath("data", _BUNDLED).open("rb")
        return gzip.open(raw, "rt", encoding="utf-8")
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_mooncake(
    path: str | Path | None = None, *, block_size: int = MOONCAKE_BLOCK_SIZE, limit: int = 0
) -> Trace:
    """Read a Mooncake trace; `path=None` reads the bundled synthetic trace.

    `timestamp` is in milliseconds; `hash_ids` are the prompt's block hashes (the
    last block may be partial). `limit` > 0 keeps only the first `limit` requests.
    """
    requests: list[Request] = []
    with _open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                request = Request(
                    arrival=float(row["timestamp"]) / 1000.0,
                    blocks=tuple(row["hash_ids"]),
                    input_tokens=int(row["input_length"]),
                    output_tokens=int(row.get("output_length", 0)),
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path or _BUNDLED}:{number}: not a Mooncake row: {exc}") from exc
            requests.append(request)
            if limit and len(requests) >= limit:
                break
    name = "mooncake" if path is None else Path(path).name
    return Trace(name=name, block_size=block_size, requests=requests)
