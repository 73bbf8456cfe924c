"""Rebuild the L2 index from the slot headers of every rank file.

The write protocol (see TieredStore / _io.write_block) per rank file is:

1. invalidate the slot header (EMPTY),
2. write the payload,
3. [l2_fsync='always': fdatasync]
4. write the new header (key, generation, length, depth, payload checksum, header checksum),
5. [l2_fsync='always': fdatasync]

so after a process crash at any point a slot's header is EMPTY, or describes exactly the
payload beside it. A block is recovered only if every rank file holds a valid header with
the same key and generation at that slot; if a key appears in several slots the newest
generation wins and the others are invalidated. After a power loss without fsync a header
may describe a payload that never reached the disk: the payload checksum, verified on every
promotion (and on open with verify_on_open), turns that into a miss.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ._codec import SlotHeader, decode_table, payload_checksum
from ._config import StoreConfig
from ._errors import ConfigError
from ._l2file import L2RankFile

log = logging.getLogger("kvpool_mmap")


@dataclass
class RecoveredBlock:
    """One block found intact in every rank file."""

    slot: int
    key: bytes
    generation: int
    depth: int
    checksums: list[int]


@dataclass
class RecoveryReport:
    """What open() found in L2."""

    blocks: list[RecoveredBlock] = field(default_factory=list)
    corrupt_headers: int = 0
    """Header-table entries whose own checksum failed (torn header writes)."""
    incomplete: int = 0
    """Slots valid in some rank files only (crash between ranks)."""
    duplicates: int = 0
    """Older copies of a key that also exists in a newer slot."""
    bad_payloads: int = 0
    """Slots dropped because the payload checksum failed (verify_on_open only)."""
    wiped_files: int = 0
    """Rank files wiped because they were written under another layout."""
    max_generation: int = 0


def recover(
    files: list[L2RankFile], stride: int, verify: bool = False, fix: bool = True
) -> RecoveryReport:
    """Scan the header tables; invalidate what cannot be used (if fix); return the usable blocks."""
    report = RecoveryReport(wiped_files=sum(f.wiped for f in files))

    def invalidate_one(f: L2RankFile, slot: int) -> None:
        if fix:
            f.invalidate(slot)

    def invalidate_all(slot: int) -> None:
        if fix:
            _invalidate(files, slot)

    per_rank: list[dict[int, SlotHeader]] = []
    for f in files:
        valid, corrupt = decode_table(f.read_header_table())
        for slot in corrupt:
            report.corrupt_headers += 1
            invalidate_one(f, slot)
        for slot, hdr in list(valid.items()):
            report.max_generation = max(report.max_generation, hdr.generation)
            if hdr.length != stride:
                report.corrupt_headers += 1
                invalidate_one(f, slot)
                del valid[slot]
        per_rank.append(valid)

    newest: dict[bytes, RecoveredBlock] = {}
    for slot, (key, gen, _length, c0, depth) in per_rank[0].items():
        checksums = [c0]
        for found in per_rank[1:]:
            other = found.get(slot)
            if other is None or other.key != key or other.generation != gen:
                break
            checksums.append(other.checksum)
        if len(checksums) != len(files):
            report.incomplete += 1
            invalidate_all(slot)
            continue
        block = RecoveredBlock(slot, key, gen, depth, checksums)
        old = newest.get(key)
        if old is not None:
            report.duplicates += 1
            loser = old if old.generation < gen else block
            invalidate_all(loser.slot)
            if loser is block:
                continue
        newest[key] = block
    # slots valid in a higher rank but absent from rank 0
    for found in per_rank[1:]:
        for slot in found.keys() - per_rank[0].keys():
            report.incomplete += 1
            invalidate_all(slot)

    blocks = sorted(newest.values(), key=lambda b: b.generation)
    if verify:
        good = []
        for b in blocks:
            if all(
                payload_checksum(f.read_payload_copy(b.slot)) == c
                for f, c in zip(files, b.checksums, strict=True)
            ):
                good.append(b)
            else:
                report.bad_payloads += 1
                log.warning("L2 slot %d (key %s) failed its checksum on open", b.slot, b.key.hex())
                invalidate_all(b.slot)
        blocks = good
    report.blocks = blocks
    return report


def _invalidate(files: list[L2RankFile], slot: int) -> None:
    for f in files:
        f.invalidate(slot)


def check_l2(config: StoreConfig, fix: bool = False) -> RecoveryReport:
    """Offline check of an engine's L2 files: every header and every payload checksum.

    Never wipes; a file of another layout raises LayoutMismatchError. With fix=True,
    unusable slots are invalidated. Takes the files' lock: not while the engine runs.
    """
    if config.l2 is None:
        raise ConfigError("check_l2 needs l2 to be configured")
    return _check([partial(L2RankFile, config, r, wipe=False) for r in range(config.tp_size)], fix)


def check_l2_files(paths: Sequence[Path], fix: bool = False) -> RecoveryReport:
    """check_l2 for the L2 files of one pool given by path (all its tp ranks, in rank
    order), reading the geometry from their own superblocks."""
    if not paths:
        return RecoveryReport()
    return _check([partial(L2RankFile.open_existing, Path(p)) for p in paths], fix)


def _check(openers: Sequence[Callable[[], L2RankFile]], fix: bool) -> RecoveryReport:
    """Open every rank file (closing those already open if a later one fails), verify."""
    with contextlib.ExitStack() as stack:
        files = []
        for open_file in openers:
            f = open_file()
            stack.callback(f.close)
            files.append(f)
        return recover(files, files[0].stride, verify=True, fix=fix)
