"""`kvpool`: inspect, verify and clean pool directories.

    kvpool list  DIR...            every pool file: owner, engine, ranks, fingerprint, size, blocks
    kvpool check DIR... [--fix]    verify every L2 header and payload checksum (engine stopped)
    kvpool clear DIR... [--l2]     remove stale pool files (L1 only unless --l2)

A file is *stale* when no running process holds its lock (its engine exited or was
killed). Files a running engine holds are never changed: check and clear skip them and
say who holds them (exit status 1). A bad flag or a PATH that is no directory is one line
on stderr and exit status 2; nothing is changed then.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ._errors import KvPoolError, PoolInUseError
from ._pools import (
    POOL_FILE,
    PoolFile,
    inspect_pool_file,
    pool_files,
    remove_if_stale,
    remove_leftovers,
)
from ._recovery import check_l2_files
from ._version import __version__


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _files(dirs: Sequence[Path]) -> list[Path]:
    out = []
    for d in dirs:
        found = pool_files(d)
        if not found:
            print(f"{d}: no pool files")
        out += found
    return out


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (`kvpool: error: ...`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _pool_dir(text: str) -> Path:
    """A PATH argument: an existing directory that can be listed."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory (give a pool directory)")
    try:
        os.scandir(path).close()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text} cannot be listed: {exc.strerror}") from None
    return path


def _row(info: PoolFile) -> list[str]:
    sb = info.superblock
    if sb is None:
        return [str(info.path), info.tier, info.owner, "?", "?", "?", _size(info.size), "?", "?"]
    return [
        str(info.path),
        info.tier,
        info.owner,
        sb.engine_id,
        f"tp{sb.tp_rank}/{sb.tp_size},dp{sb.dp_rank}/{sb.dp_size}",
        sb.fingerprint.hex()[:16],
        _size(info.size),
        str(sb.num_slots),
        "-" if info.blocks is None else str(info.blocks),
    ]


def cmd_list(dirs: Sequence[Path]) -> int:
    rows = [["file", "tier", "owner", "engine", "ranks", "fingerprint", "size", "slots", "blocks"]]
    problems = []
    for path in _files(dirs):
        info = inspect_pool_file(path)
        rows.append(_row(info))
        if info.problem:
            problems.append(f"{path}: {info.problem}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for p in problems:
        print(f"unreadable superblock: {p}", file=sys.stderr)
    return 0


def _l2_pools(dirs: Sequence[Path]) -> dict[tuple[Path, str, str], list[Path]]:
    """L2 files grouped by pool (directory, engine id, dp rank), in tp-rank order."""
    pools: dict[tuple[Path, str, str], list[tuple[int, Path]]] = defaultdict(list)
    for path in _files(dirs):
        m = POOL_FILE.match(path.name)
        if m and m["tier"] == "l2":
            pools[(path.parent, m["engine"], m["dp"])].append((int(m["tp"]), path))
    return {k: [p for _, p in sorted(v)] for k, v in sorted(pools.items())}


def cmd_check(dirs: Sequence[Path], fix: bool) -> int:
    status = 0
    for (folder, engine, dp), paths in _l2_pools(dirs).items():
        name = f"{folder}/kvpool-{engine}-dp{dp}-tp*.l2 ({len(paths)} rank files)"
        try:
            report = check_l2_files(paths, fix=fix)
        except (KvPoolError, OSError) as exc:
            print(f"{name}: not checked: {exc}")
            status = 1
            continue
        bad = report.corrupt_headers + report.incomplete + report.bad_payloads
        print(
            f"{name}: {len(report.blocks)} blocks verified, {report.bad_payloads} bad payloads, "
            f"{report.corrupt_headers} corrupt headers, {report.incomplete} incomplete, "
            f"{report.duplicates} duplicates" + (" (invalidated)" if fix and bad else "")
        )
        if bad and not fix:
            status = 1
    return status


def cmd_clear(dirs: Sequence[Path], l2: bool) -> int:
    status = 0
    for d in dirs:
        for leftover in remove_leftovers(d):
            print(f"removed {leftover}")
    for path in _files(dirs):
        if path.name.endswith(".l2") and not l2:
            continue
        try:
            remove_if_stale(path, "PATH", "Stop that engine first.")
        except PoolInUseError as exc:
            print(f"kept {path}: {exc.strerror}")
            status = 1
        except FileNotFoundError:
            continue
        else:
            print(f"removed {path}")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="kvpool", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_list = sub.add_parser("list", help="show every pool file and who owns it")
    p_check = sub.add_parser("check", help="verify L2 checksums (engine stopped)")
    p_check.add_argument("--fix", action="store_true", help="invalidate unusable slots")
    p_clear = sub.add_parser("clear", help="remove stale pool files")
    p_clear.add_argument(
        "--l2", action="store_true", help="also remove stale L2 files (their blocks are lost)"
    )
    for p in (p_list, p_check, p_clear):
        p.add_argument("dirs", nargs="+", type=_pool_dir, metavar="PATH", help="pool directory")
    args = parser.parse_args(argv)
    if args.command == "list":
        return cmd_list(args.dirs)
    if args.command == "check":
        return cmd_check(args.dirs, args.fix)
    return cmd_clear(args.dirs, args.l2)


if __name__ == "__main__":
    sys.exit(main())
