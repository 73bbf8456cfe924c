"""Main job of memkv-vllm: one shared store, two vLLM OpenAI servers sharing it.

Builds a tiny random-weight model, starts the store on 127.0.0.1 (`memkv serve`, or with
`--backend mooncake` a Mooncake Store cluster: `mooncake_master` and three store
processes) and two vLLM servers (A and B) whose `TieringOffloadingSpec` has a `memkv`
secondary tier. Agents with a shared system prompt talk to A first; then the same
conversations continue on B, which has never seen them: B's prefix hits come from the
store, put there by A. Prints per-instance hit counts (from each server's /metrics), TTFT,
and whether B generated exactly A's tokens.

On the CPU build of vLLM, the primary CPU tier needs a torch copy worker (vLLM's own
refuses the CPU platform); the demo uses the test scaffold `CPUTestTieringSpec`
(tests-integration/scaffold/) for
that, which only replaces the GPU<->CPU-pool copies. The MemKV tier is the shipped code.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PKG = HERE.parent
ROOT = PKG.parents[1]
SCAFFOLD = ROOT / "tests-integration" / "scaffold"
sys.path.insert(0, str(ROOT / "tools"))

import tiny_model  # noqa: E402
from local_ports import free_port  # noqa: E402
from mooncake_cluster import MooncakeCluster  # noqa: E402
from vllm_server import VllmServer, metric_sum  # noqa: E402

BLOCK = 32


def tier_config(scaffold: bool) -> dict[str, Any]:
    spec = (
        {"spec_name": "CPUTestTieringSpec", "spec_module_path": "cpu_tiering_spec"}
        if scaffold
        else {"spec_name": "TieringOffloadingSpec"}
    )
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            **spec,
            "cpu_bytes_to_use": 8 << 20,
            "block_size": BLOCK,
            "secondary_tiers": [{"type": "memkv", "n_read_threads": 2, "n_write_threads": 2}],
        },
    }


def workload(agents: int, seed: int = 0) -> list[list[int]]:
    vocab = getattr(tiny_model, "SAFE_VOCAB", 250)
    rng = random.Random(seed)
    system = [rng.randrange(10, vocab) for _ in range(20 * BLOCK)]
    return [system + [rng.randrange(10, vocab) for _ in range(200)] for _ in range(agents)]


def counter(samples: dict[str, float], name: str, **labels: str) -> float:
    return metric_sum(samples, name + "_total", **labels) + metric_sum(samples, name, **labels)


def rate(samples: dict[str, float], op: str) -> float:
    """MB/s of one op's transfer jobs (bytes over summed job time), 0 if none ran."""
    nbytes = counter(samples, f"vllm:kv_offload_memkv_{op}_bytes")
    seconds = metric_sum(samples, "vllm:kv_offload_memkv_job_seconds_sum", op=op)
    return nbytes / seconds / 1e6 if seconds > 0 else 0.0


def start_memkv(port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "memkv_client.cli", "serve",
           "--listen", f"127.0.0.1:{port}", "--memory", "512MiB"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    time.sleep(1.0)
    if proc.poll() is not None:
        raise RuntimeError(f"memkv serve exited; see {log}")
    return proc


class Store:
    """The shared store of the demo: `memkv serve` or a Mooncake Store cluster."""

    def __init__(self, backend: str, work: Path) -> None:
        self.backend = backend
        if backend == "mooncake":
            self.cluster = MooncakeCluster(work, stores=3, segment_mb=256).start()
            self.env = self.cluster.env()
            self.where = f"Mooncake Store (master {self.cluster.master_address}, 3 segments)"
        else:
            port = free_port()
            self.memkv = start_memkv(port, work / "memkv.log")
            self.env = {"MEMKV_SERVERS": f"127.0.0.1:{port}", "MEMKV_TRANSPORT": "tcp"}
            self.where = f"MemKV on 127.0.0.1:{port}"

    def stop(self) -> None:
        if self.backend == "mooncake":
            self.cluster.stop()
        else:
            self.memkv.terminate()
            self.memkv.wait(10)


def run(args: argparse.Namespace) -> int:
    import vllm  # noqa: F401  (fail early if vLLM is missing)
    from memkv_vllm._compat import vllm_version

    work = Path(args.workdir or tempfile.mkdtemp(prefix="memkv-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    model = str(tiny_model.build(work / "tiny-llama", "llama"))
    store = Store(args.backend, work)
    scaffold = not args.gpu
    env = {
        "PYTHONHASHSEED": "0",  # both instances must hash blocks alike
        **store.env,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(SCAFFOLD), os.environ.get("PYTHONPATH", "")) if p and scaffold
        ),
    }
    servers = {
        name: VllmServer(model, work / f"vllm-{name}.log", tier_config(scaffold), env=env)
        for name in ("A", "B")
    }
    print(f"vLLM {vllm_version()}; {store.where}; logs in {work}", flush=True)
    try:
        threads = [threading.Thread(target=s.start) for s in servers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, s in servers.items():
            if s.proc is None or s.proc.poll() is not None:
                raise RuntimeError(f"server {name} did not start; see {s.log_path}")
        prompts = workload(args.agents)
        results: dict[str, list[tuple[list[int], float]]] = {}
        for name in ("A", "B"):  # B continues conversations it has never seen
            results[name] = [servers[name].complete(p, max_tokens=16) for p in prompts]
            time.sleep(2)  # let A's stores to MemKV finish before B asks
        time.sleep(3)  # stats are pushed to /metrics periodically
        rows = []
        for name, s in servers.items():
            m = s.metrics()
            rows.append(
                (
                    name,
                    len(prompts),
                    sum(len(p) for p in prompts),
                    int(counter(m, "vllm:kv_offload_memkv_blocks", op="store")),
                    int(counter(m, "vllm:kv_offload_memkv_blocks", op="load")),
                    int(counter(m, "vllm:kv_offload_memkv_blocks", op="load")) * BLOCK,
                    int(counter(m, "vllm:kv_offload_memkv_lookups", result="hit")),
                    int(counter(m, "vllm:kv_offload_memkv_lookups", result="miss")),
                    statistics.mean(t for _, t in results[name]) * 1000,
                    rate(m, "store"),
                    rate(m, "load"),
                )
            )
    finally:
        for s in servers.values():
            s.stop()
        store.stop()
    print()
    print("\n".join(table(rows)))
    print(LEGEND)
    same = [a[0] == b[0] for a, b in zip(results["A"], results["B"], strict=True)]
    print(f"\nB generated exactly A's tokens for {sum(same)}/{len(same)} requests")
    loaded_b = rows[1][4]
    print(
        f"cross-instance: B loaded {loaded_b} blocks ({loaded_b * BLOCK} tokens) that A "
        f"stored in {args.backend}"
        if loaded_b
        else "cross-instance: no hits (see the logs)"
    )
    print(
        "(TTFT on this tiny random model says little: its prefill costs less than fetching "
        "over TCP and the extra scheduler step a MemKV lookup takes)"
    )
    return 0 if loaded_b and all(same) else 1


HEADER = ("instance", "requests", "prompt tok", "blocks stored", "blocks loaded",
          "tok from store", "lookup hit", "lookup miss", "TTFT ms", "store MB/s",
          "load MB/s")  # fmt: skip


def table(rows: list[tuple[Any, ...]]) -> list[str]:
    """The result table's lines: one line per `HEADER` entry, one column per instance
    (rows are instances, in `HEADER`'s order), so it stays narrow."""

    def cell(value: Any) -> str:
        return f"{value:>12.1f}" if isinstance(value, float) else f"{value:>12}"

    return [
        f"{name:<16}" + "".join(cell(row[index]) for row in rows)
        for index, name in enumerate(HEADER)
    ]


LEGEND = """
  instance        A serves the conversations first; B, a second vLLM server that never saw
                  them, serves the same prompts afterwards
  requests        requests sent to the instance; prompt tok: their prompt tokens
  blocks stored   KV blocks the instance wrote to the shared store (A: every new block)
  blocks loaded   blocks it read back from the store; tok from store: their tokens
  lookup hit/miss the instance's lookups in the store, by answer (B should hit what A stored)
  TTFT ms         mean time to first token; on this tiny CPU model a store hit costs about
                  what recomputing does (see the note below), on a GPU it is faster
  store/load MB/s bytes moved over the time the transfer jobs ran
  A good result: B loads blocks and hits where A stored and missed, and B generates
  exactly A's tokens."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--workdir", help="keep model and logs here (default: a temp dir)")
    ap.add_argument("--gpu", action="store_true", help="CUDA vLLM: use TieringOffloadingSpec")
    ap.add_argument("--backend", choices=("memkv", "mooncake"), default="memkv",
                    help="the shared store: memkv serve, or a Mooncake Store cluster")  # fmt: skip
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
