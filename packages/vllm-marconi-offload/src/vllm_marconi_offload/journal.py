"""Descriptions of L2's blocks on disk, so a restart announces L2 as self-describing.

A JSON-lines file next to L2's rank-0 file (`<l2 file>.events`: it goes with the pool):
one line per block that became loadable from L2, appended as the KV events are taken,
rewritten with only what L2 holds at start and whenever stale lines outnumber live ones.
A line is never trusted beyond what it claims: only keys L2 itself recovered are read
back, and a missing, torn or damaged file only leaves blocks announced by hash.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, TextIO

from .block_info import BlockInfo
from .log import logger


class DescriptionJournal:
    """Append-mostly file of `BlockInfo`s by store key. Scheduler side, one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        """Lines written since the last rewrite."""
        self._file: TextIO | None = None

    def load(self, keys: Collection[bytes]) -> dict[bytes, BlockInfo]:
        """The descriptions the file has for `keys`."""
        found: dict[bytes, BlockInfo] = {}
        try:
            text = self.path.read_text()
        except OSError:
            return found
        for line in text.splitlines():
            try:
                key, info = _decode(json.loads(line))
            except (ValueError, TypeError, KeyError) as exc:
                logger.warning("KV events: skipped a damaged line of %s: %s", self.path, exc)
                continue
            if key in keys:
                found[key] = info
        logger.info(
            "KV events: %d of %d L2 blocks described by %s", len(found), len(keys), self.path
        )
        return found

    def append(self, blocks: Iterable[tuple[bytes, BlockInfo]]) -> None:
        lines = [line for key, info in blocks if (line := _line(key, info))]
        if not lines:
            return
        if self._file is None:
            self._file = self.path.open("a")
        self._file.write("".join(lines))
        self._file.flush()
        self.lines += len(lines)

    def rewrite(self, blocks: Iterable[tuple[bytes, BlockInfo]]) -> None:
        """Replace the file (atomically) by these blocks' lines."""
        if self._file is not None:
            self._file.close()
            self._file = None
        lines = [line for key, info in blocks if (line := _line(key, info))]
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(lines))
        tmp.replace(self.path)
        self.lines = len(lines)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(key: bytes, info: BlockInfo) -> str:
    """A block's line; empty if JSON cannot carry its extra keys (prompt-embedding
    digests): that block is announced by hash only after a restart."""
    try:
        return json.dumps(_encode(key, info)) + "\n"
    except (TypeError, ValueError):
        return ""


def _encode(key: bytes, info: BlockInfo) -> dict[str, Any]:
    return {
        "key": key.hex(),
        "parent": info.parent_hash.hex() if info.parent_hash is not None else None,
        "tokens": info.token_ids.tolist(),
        "extra": info.extra_keys,
        "lora": [info.lora_id, info.lora_name],
    }


def _decode(record: dict[str, Any]) -> tuple[bytes, BlockInfo]:
    parent = record["parent"]
    extra = record["extra"]
    lora_id, lora_name = record["lora"]
    info = BlockInfo(
        parent_hash=bytes.fromhex(parent) if parent is not None else None,
        token_ids=array("i", record["tokens"]),
        extra_keys=_tuples(extra) if extra is not None else None,
        lora_id=lora_id,
        lora_name=lora_name,
    )
    return bytes.fromhex(record["key"]), info


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples vLLM's extra keys are made of."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
