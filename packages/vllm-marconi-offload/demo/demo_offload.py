"""Main job: a real vLLM OpenAI server with vllm-marconi-offload, end to end.

Builds a tiny random-weight model, starts the server with L1 in /dev/shm and L2 in a local
directory, replays a multi-turn workload (agents sharing a system prompt, conversations
that idle and resume, more live context than vLLM's KV cache holds), restarts the server,
replays again, and prints per-tier hits and TTFT for each replay, next to the same
workload on a server without offload.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

import tiny_model
from vllm_server import VllmServer, metric_sum

VOCAB = tiny_model.SAFE_VOCAB


def conversations(agents: int, turns: int, seed: int = 0) -> list[list[list[int]]]:
    """Per agent, the prompt of each turn: system prompt + history + new user message."""
    rng = random.Random(seed)
    system = [rng.randrange(10, VOCAB) for _ in range(640)]
    out = []
    for _ in range(agents):
        history = list(system)
        prompts = []
        for _ in range(turns):
            history += [rng.randrange(10, VOCAB) for _ in range(rng.randint(300, 600))]
            prompts.append(list(history))
            history += [rng.randrange(10, VOCAB) for _ in range(16)]  # the reply, as context
        out.append(prompts)
    return out


def replay(server: VllmServer, convs: list[list[list[int]]]) -> list[float]:
    """Round-robin over agents turn by turn, so each conversation idles between turns."""
    ttfts = []
    for turn in range(len(convs[0])):
        for prompts in convs:
            _, ttft = server.complete(prompts[turn], max_tokens=16)
            ttfts.append(ttft)
    return ttfts


def counters(server: VllmServer) -> dict[str, float]:
    samples = server.metrics()
    return {
        "queries": metric_sum(samples, "vllm:prefix_cache_queries_total"),
        "hbm": metric_sum(samples, "vllm:prefix_cache_hits_total"),
        "l1": metric_sum(samples, "vllm:marconi_offload_hit_tokens_total", tier="l1"),
        "l2": metric_sum(samples, "vllm:marconi_offload_hit_tokens_total", tier="l2"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path(".work/demo"))
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    model = str(tiny_model.build(workdir / "tiny-llama", "llama"))
    l1 = Path(tempfile.gettempdir() if not Path("/dev/shm").is_dir() else "/dev/shm")
    l1 = l1 / "kv-offload-demo-l1"
    l2 = workdir / "l2"
    shutil.rmtree(l2, ignore_errors=True)
    config = {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_pool_path": str(l1),
            "cpu_bytes_to_use": 32 << 20,
            "l2_pool_path": str(l2),
            "l2_bytes_to_use": 256 << 20,
        },
    }
    convs = conversations(args.agents, args.turns)
    rows = []
    runs = (("no offload", None), ("first server", config), ("after restart", config))
    for label, kv_transfer_config in runs:
        server = VllmServer(
            model,
            workdir / "server.log",
            kv_transfer_config=kv_transfer_config,
            kv_cache_memory_bytes=6 << 20,  # ~6k tokens of vLLM KV cache: half the live context
            max_model_len=4096,
        )
        print(f"starting vLLM ({label}) on {server.url} ...", flush=True)
        server.start()
        try:
            ttfts = replay(server, convs)
            rows.append((label, ttfts, counters(server)))
        finally:
            server.stop()
    print()
    print(f"{'replay':<15}{'requests':>9}{'TTFT p50 ms':>12}{'TTFT mean ms':>13}"
          f"{'prompt tok':>11}{'HBM hit':>9}{'L1 hit':>8}{'L2 hit':>8}")  # fmt: skip
    for label, ttfts, c in rows:
        print(
            f"{label:<15}{len(ttfts):>9}{1000 * statistics.median(ttfts):>12.1f}"
            f"{1000 * statistics.mean(ttfts):>13.1f}{int(c['queries']):>11}"
            f"{int(c['hbm']):>9}{int(c['l1']):>8}{int(c['l2']):>8}"
        )
    print(f"\nserver log: {workdir / 'server.log'}")
    shutil.rmtree(l1, ignore_errors=True)


if __name__ == "__main__":
    main()
