"""Loopback throughput benchmark: batch put/get of 1 MiB and 16 MiB values vs iperf3.

``python -m memkv_client.bench`` starts ``iperf3`` and a ``memkv serve`` process on
127.0.0.1, measures both in the same run and prints GB/s (10^9 bytes/s) and the ratio
to iperf3. Exit status 0 unless something failed (the ratio is reported, not enforced:
loopback speed on shared VMs varies by ±40% between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .client import Client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def iperf3_gbps(seconds: int, length: str | None) -> float:
    """One-stream iperf3 throughput over 127.0.0.1, in GB/s."""
    exe = shutil.which("iperf3")
    if exe is None:
        raise RuntimeError("iperf3 is not installed (apt-get install -y iperf3)")
    port = _free_port()
    srv = subprocess.Popen(
        [exe, "-s", "-B", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        cmd = [exe, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"]
        if length:
            cmd += ["-l", length]
        data: dict[str, Any] = {}
        for _ in range(20):  # the server may not be listening yet (bounded: about 4 s)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
            data = json.loads(out.stdout or "{}")
            if "sum_received" in data.get("end", {}):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"iperf3 failed: {data.get('error', out.stderr)!r}")
        return float(data["end"]["sum_received"]["bits_per_second"]) / 8e9
    finally:
        srv.kill()
        srv.wait()


def start_server(memory: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "memkv_client.server", "--listen", f"127.0.0.1:{port}",
         "--memory", memory, "--lanes", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc


def run_size(
    client: Client, value_size: int, total: int, rounds: int, batch: int
) -> dict[str, float]:
    """Best-of-``rounds`` put and get GB/s moving ``total`` bytes per round."""
    count = max(batch, total // value_size)
    bufs = [bytearray(os.urandom(64)) * (value_size // 64) for _ in range(min(count, 8))]
    dst = [bytearray(value_size) for _ in range(min(count, batch))]
    for d in dst:
        d[:] = b"\x01" * value_size  # pre-fault
    keys = [f"bench/{value_size}/{i}" for i in range(count)]
    best_put = best_get = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for start in range(0, count, batch):
            items = [
                (keys[i], bufs[i % len(bufs)], value_size)
                for i in range(start, min(count, start + batch))
            ]
            res = client.batch_put_views(items)
            if not all(res):
                raise RuntimeError(f"put failed: {[r for r in res if not r][:3]}")
        best_put = max(best_put, count * value_size / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        for start in range(0, count, batch):
            idx = range(start, min(count, start + batch))
            items = [(keys[i], dst[j], value_size) for j, i in enumerate(idx)]
            res = client.batch_get_into(items)
            if not all(res):
                raise RuntimeError(f"get failed: {[r for r in res if not r][:3]}")
        best_get = max(best_get, count * value_size / (time.perf_counter() - t0) / 1e9)
    if dst[0] != bufs[(count - len(dst)) % len(bufs)] and count % batch == 0:
        raise RuntimeError("read-back mismatch")
    return {"put": best_put, "get": best_get}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memkv_client.bench")
    ap.add_argument("--total-mib", type=int, default=1024, help="bytes moved per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iperf-seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)
    ip = iperf3_gbps(args.iperf_seconds, None)
    ip_1m = iperf3_gbps(args.iperf_seconds, "1M")
    port = _free_port()
    server = start_server(f"{args.total_mib + 64}MiB", port)
    results: dict[str, dict[str, float]] = {}
    try:
        with Client(
            servers=[f"127.0.0.1:{port}"], transport="tcp", num_connections=args.connections
        ) as client:
            for size in (1 << 20, 16 << 20):
                results[f"{size >> 20}MiB"] = run_size(
                    client, size, args.total_mib << 20, args.rounds, args.batch
                )
    finally:
        server.terminate()
        server.wait(30)
    base = max(ip, ip_1m)
    print(f"iperf3 127.0.0.1 one stream: default {ip:.2f} GB/s, -l 1M {ip_1m:.2f} GB/s")
    print(f"baseline (best of the two): {base:.2f} GB/s")
    for name, r in results.items():
        print(
            f"memkv {name:>5}: put {r['put']:.2f} GB/s ({r['put'] / base:.0%} of iperf3), "
            f"get {r['get']:.2f} GB/s ({r['get'] / base:.0%})"
        )
    print(json.dumps({"iperf3_gbps": base, "memkv": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
