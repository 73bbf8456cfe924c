"""Batch put/get throughput of our `memkv serve` and of Mooncake Store, same run, loopback.

For 1 MiB and 16 MiB values, in batches of 8 (the tier's `blocks_per_op`), measures each
backend twice: through its own Python client (`memkv_client.Client.batch_put_views` /
`batch_get_into`; Mooncake's `batch_put_from` / `batch_get_into` on a registered
buffer) and through memkv-vllm's store interface (what the tier and the direct mode call).
One `memkv serve` against one Mooncake store process (plus its master), both holding
values in memory; the client contributes no memory. Prints GB/s (median of the repeats)
and the ratio Mooncake / memkv per row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))

from memkv_server import MemKVServer  # noqa: E402
from mooncake_cluster import MooncakeCluster  # noqa: E402

BATCH = 8
Op = Callable[[list[bytes]], int]  # one batch of keys -> items that succeeded


class Backend:
    """Raw client and memkv-vllm store of one backend, over one pinned buffer."""

    def __init__(self, name: str, store: Any, buf: np.ndarray, ops: tuple[Op, Op, Op]) -> None:
        self.name, self.store, self.buf = name, store, buf
        self.raw_put, self.raw_get, self.clear = ops
        self.size = int(buf.shape[1])

    def via_store(self) -> tuple[Op, Op]:
        """Put and get through memkv-vllm's store interface."""

        def put(keys: list[bytes]) -> int:
            return sum(bool(r) for r in self.store.batch_put(_items(keys, self.buf, self.size)))

        def get(keys: list[bytes]) -> int:
            items = _items(keys, self.buf, self.size)
            return sum(bool(r) for r in self.store.batch_get_into(items))

        return put, get


def _items(keys: list[bytes], buf: np.ndarray, size: int) -> list[tuple[bytes, Any, int]]:
    return [(k, buf[i], size) for i, k in enumerate(keys)]


def memkv_backend(server: MemKVServer, buf: np.ndarray, size: int) -> Backend:
    import memkv_client
    from memkv_vllm.store import StoreConfig, open_store

    os.environ.update(server.env())
    client = memkv_client.Client()
    store = open_store(StoreConfig(), True, "bench")

    def put(keys: list[bytes]) -> int:
        return sum(bool(r) for r in client.batch_put_views(_items(keys, buf, size)))

    def get(keys: list[bytes]) -> int:
        return sum(bool(r) for r in client.batch_get_into(_items(keys, buf, size)))

    def clear(keys: list[bytes]) -> int:
        return sum(client.delete(k) for k in keys)

    return Backend("memkv", store, buf, (put, get, clear))


def mooncake_backend(cluster: MooncakeCluster, buf: np.ndarray, size: int) -> Backend:
    from memkv_vllm.store import StoreConfig, open_store
    from memkv_vllm.store.mooncake import mooncake_key

    os.environ.update(cluster.env())
    store = open_store(StoreConfig.resolve({}, "bench"), True, "bench")
    store.register(buf)
    raw = store._store  # the MooncakeDistributedStore under the adapter
    base = int(buf.ctypes.data)
    stride = int(buf.strides[0])

    def put(keys: list[bytes]) -> int:
        names = [mooncake_key(k) for k in keys]
        addrs = [base + i * stride for i in range(len(keys))]
        return sum(c == 0 for c in raw.batch_put_from(names, addrs, [size] * len(keys)))

    def get(keys: list[bytes]) -> int:
        names = [mooncake_key(k) for k in keys]
        addrs = [base + i * stride for i in range(len(keys))]
        return sum(c == size for c in raw.batch_get_into(names, addrs, [size] * len(keys)))

    def clear(keys: list[bytes]) -> int:
        time.sleep(cluster.lease_ms / 1000 + 0.05)  # a read leases the value
        return sum(c == 0 for c in raw.batch_remove([mooncake_key(k) for k in keys]))

    return Backend("mooncake", store, buf, (put, get, clear))


def measure(backend: Backend, via: str, volume: int, tag: str) -> tuple[float, float]:
    """(put GB/s, get GB/s) of `volume` bytes in batches of 8, then the keys are removed."""
    size = backend.size
    keys = [f"bench/{tag}/{i}".encode() for i in range(max(BATCH, volume // size))]
    batches = [keys[i : i + BATCH] for i in range(0, len(keys), BATCH)]
    put, get = (backend.raw_put, backend.raw_get) if via == "raw" else backend.via_store()
    rates = []
    for op in (put, get):
        start = time.perf_counter()
        done = sum(op(b) for b in batches)
        seconds = time.perf_counter() - start
        if done != len(keys):
            raise RuntimeError(f"{backend.name} {via}: {done} of {len(keys)} items succeeded")
        rates.append(done * size / seconds / 1e9)
    cleared = backend.clear(keys)
    if cleared != len(keys):
        print(f"warning: {backend.name} removed {cleared} of {len(keys)} values", flush=True)
    return rates[0], rates[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--volume-mb", type=int, default=256, help="bytes per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stores-"))
    memory_mb = 2 * args.volume_mb + 64
    server = MemKVServer(work / "memkv.log", memory=f"{memory_mb}MiB", lanes=4).start()
    # a read fails (LEASE_EXPIRED) if its batch takes longer than the lease: 2 s
    cluster = MooncakeCluster(work, stores=1, segment_mb=memory_mb, lease_ms=2000).start()
    rows = []
    try:
        for size in (1 << 20, 16 << 20):
            buf = np.random.default_rng(0).integers(0, 256, (BATCH, size), dtype=np.uint8)
            backends = [memkv_backend(server, buf, size), mooncake_backend(cluster, buf, size)]
            for via in ("raw", "memkv-vllm"):
                results: dict[str, list[tuple[float, float]]] = {b.name: [] for b in backends}
                for rep in range(args.repeats):
                    for b in backends:  # alternate: drift hits both alike
                        tag = f"{size}-{via}-{rep}"
                        results[b.name].append(measure(b, via, args.volume_mb << 20, tag))
                med = {n: [statistics.median(x[i] for x in r) for i in (0, 1)]
                       for n, r in results.items()}  # fmt: skip
                rows.append((size >> 20, via, *med["memkv"], *med["mooncake"]))
            for b in backends:
                b.store.close()
    finally:
        cluster.stop()
        server.stop()
    print(f"\nloopback, batches of {BATCH}, {args.volume_mb} MiB per measurement, median of "
          f"{args.repeats}; GB/s")  # fmt: skip
    header = ("value MiB", "client", "memkv put", "memkv get", "mooncake put", "mooncake get",
              "put ratio", "get ratio")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in header))
    for size_mb, via, mp, mg, kp, kg in rows:
        cells = [size_mb, via, mp, mg, kp, kg, kp / mp, kg / mg]
        print("  ".join(f"{c:>12.2f}" if isinstance(c, float) else f"{c:>12}" for c in cells))
    print(
        "(ratio = Mooncake / memkv; client 'raw' is each engine's own Python client, "
        "'memkv-vllm' the store interface the tier and the direct mode use)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
