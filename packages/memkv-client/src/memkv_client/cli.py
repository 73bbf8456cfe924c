"""The `memkv` command: `serve`, `stats` and `net topo`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._version import __version__
from .errors import MemKVError

__all__ = ["main"]


def _stats(args: argparse.Namespace) -> int:
    from .client import Client

    overrides: dict[str, Any] = {"servers": [args.server]} if args.server else {}
    try:
        with Client(transport="tcp", **overrides) as client:
            servers = client.servers()
            out = {s: client.stats(s) for s in servers}
    except MemKVError as exc:
        print(f"memkv stats: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for server, st in out.items():
        store = st["store"]
        print(
            f"{server}  id={st['server_id']}  up={st['uptime_s']}s  "
            f"conns={st['live_connections']}  requests={st['requests']}"
        )
        print(f"  memory {store['used']}/{store['capacity']} bytes, {store['items']} items")
        for ln in store["lanes"]:
            print(
                f"  lane {ln['lane']}: used {ln['used']}/{ln['share']}  items {ln['items']}  "
                f"hits {ln['hits']}  misses {ln['misses']}  evictions {ln['evictions']}"
            )
    return 0


def _topo(args: argparse.Namespace) -> int:
    from .topology import affinity_table, choice_table

    print(affinity_table(args.sysfs))
    print("\nRDMA NIC per GPU (MEMKV_RDMA_DEVICES narrows the candidates):")
    print(choice_table(args.sysfs))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The `memkv` command. A bad flag value is one line on stderr and exit status 2."""
    from .server import add_serve_arguments, serve
    from .server.args import OneLineParser, address

    ap = OneLineParser(prog="memkv", description="MemKV server and tools.")
    ap.add_argument("--version", action="version", version=f"memkv {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    sp = sub.add_parser(
        "serve", help="run a server node", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_serve_arguments(sp)
    sp.set_defaults(func=serve)
    st = sub.add_parser("stats", help="print statistics of live servers")
    st.add_argument("--server", type=address, help="host:port (default: the configured servers)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_stats)
    net = sub.add_parser("net", help="network tools")
    netsub = net.add_subparsers(dest="net_command", required=True)
    topo = netsub.add_parser(
        "topo", help="print the GPU<->NIC PCIe affinity table and each GPU's RDMA NIC"
    )
    topo.add_argument("--sysfs", default="/sys", help=argparse.SUPPRESS)
    topo.set_defaults(func=_topo)
    args = ap.parse_args(argv)
    try:
        result: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `memkv stats --json | head`: the reader left early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
