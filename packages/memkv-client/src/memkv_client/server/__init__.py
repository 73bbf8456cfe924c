"""The MemKV server: `memkv serve` / `python -m memkv_client.server`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from ..auth import ClockWindow, Signer
from ..sockio import parse_address
from . import args as flags
from .args import OneLineParser, parse_size
from .keys import server_key
from .net import MemKVServer
from .spill import SpillDir
from .storage import BLOCK_SIZE, Store

__all__ = ["MemKVServer", "Store", "add_serve_arguments", "main", "parse_size", "serve"]


def add_serve_arguments(ap: argparse.ArgumentParser) -> None:
    """The `memkv serve` flags; each value is checked as it is parsed (see `.args`)."""
    ap.add_argument(
        "--listen", type=flags.listen_address, default="127.0.0.1:9900",
        help="host:port (port 0 = any)",
    )  # fmt: skip
    ap.add_argument("--memory", type=flags.size, default="4GiB", help="value memory, e.g. 4GiB")
    ap.add_argument(
        "--lanes", type=flags.int_in(1, 1024), default=4, help="capacity lanes (key namespaces)"
    )
    ap.add_argument("--dir", default=None, help="spill evicted values to this directory")
    ap.add_argument(
        "--dir-capacity", type=flags.size, default=None, help="spill size limit (None: 4x memory)"
    )
    ap.add_argument(
        "--replay-window-ms",
        type=flags.int_in(1),
        default=30000,
        help="refuse requests whose timestamp is further than this from the server clock",
    )
    ap.add_argument(
        "--max-connections",
        type=flags.int_in(1),
        default=None,
        help="connections served at once (None: ulimit -n minus 64, at most 4096)",
    )
    ap.add_argument(
        "--frame-timeout-s",
        type=flags.seconds,
        default=10.0,
        help="a frame must arrive (and a reply leave) within this, plus 1 s per 8 MiB",
    )
    ap.add_argument(
        "--idle-timeout-s",
        type=flags.seconds,
        default=300.0,
        help="close connections idle this long",
    )
    ap.add_argument(
        "--exists-lease-ms",
        type=flags.int_in(0),
        default=30000,
        help="an EXISTS that finds a value shields it from eviction this long (0 = off)",
    )
    ap.add_argument(
        "--rdma", choices=["auto", "on", "off"], default="auto", help="serve one-sided RDMA"
    )
    ap.add_argument("--rdma-devices", default="", help="comma-separated device names (any)")
    ap.add_argument("--no-prefault", action="store_true", help="do not pre-fault memory")
    ap.add_argument("-v", "--verbose", action="store_true")


def serve(args: argparse.Namespace) -> int:
    """Run a server until SIGTERM/SIGINT; returns the exit status (2: a bad flag value
    or setup error, reported in one line)."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    try:
        host, port = parse_address(args.listen, allow_port_zero=True)
        memory = parse_size(args.memory)
        spill_cap = parse_size(args.dir_capacity) if args.dir_capacity else 4 * memory
        if memory < args.lanes * BLOCK_SIZE:
            raise ValueError(
                f"--memory {args.memory}: too small for --lanes {args.lanes}; give at least "
                f"{args.lanes * BLOCK_SIZE >> 10}KiB ({BLOCK_SIZE >> 10}KiB per lane)"
            )
        key, key_source = server_key(host)
        spill = _spill_dir(args.dir, spill_cap) if args.dir else None
        store = Store(
            memory,
            args.lanes,
            spill,
            prefault=not args.no_prefault,
            lease_s=args.exists_lease_ms / 1000,
        )
    except (ValueError, OSError) as exc:
        print(f"memkv serve: {exc}", file=sys.stderr)
        return 2
    responder, rdma_note = None, "rdma=off (--rdma off)"
    if args.rdma != "off":
        from ..verbs import open_verbs_backend
        from .rdma import RdmaResponder

        devices = [d for d in args.rdma_devices.split(",") if d]
        backend, reason = open_verbs_backend(devices)
        if backend is None:
            if args.rdma == "on":
                print(f"memkv serve: --rdma on: {reason}", file=sys.stderr)
                return 2
            rdma_note = f"rdma=off ({reason})"
        else:
            responder, rdma_note = RdmaResponder(backend, store), "rdma=on"
    server = MemKVServer(
        store,
        host,
        port,
        Signer(key),
        ClockWindow(args.replay_window_ms * 1_000_000),
        rdma=responder,
        max_connections=args.max_connections,
        frame_timeout=args.frame_timeout_s,
        idle_timeout=args.idle_timeout_s,
    )
    try:
        server.start()
    except OSError as exc:
        print(f"memkv serve: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: FrameType | None) -> None:
        server.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(
        f"memkv: listening on {server.address} memory={store.capacity} lanes={args.lanes}"
        + (f" dir={args.dir}" if args.dir else "")
        + f" {rdma_note} key={key_source} max_connections={server.max_connections}",
        flush=True,
    )
    server.serve_forever()
    print("memkv: stopped", flush=True)
    return 0


def _spill_dir(directory: str, capacity: int) -> SpillDir:
    """The spill directory; an OSError becomes a ValueError naming `--dir`."""
    try:
        return SpillDir(directory, capacity)
    except OSError as exc:
        raise ValueError(f"--dir {directory}: {exc.strerror or exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    ap = OneLineParser(
        prog="memkv serve",
        description="Run a MemKV server node.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_serve_arguments(ap)
    return serve(ap.parse_args(argv))
