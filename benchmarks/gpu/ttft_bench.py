"""TTFT of one long prompt on real vLLM with the 8B-class random-weight Llama, per mode.

plain:  cold prefill, (a) HBM prefix hit (right after the cold prefill, and again after a
        second's pause), (d) recompute after the HBM prefix cache reset.
ours:   cold prefill (with our stores), (b) L1 hit after an HBM reset, 8 greedy tokens of
        another prompt cold and from L1 (`tokens.identical`), then (c) L2 hit after other
        prompts pushed the prompt out of L1 (L1 5 GiB, L2 on local disk).
native: cold prefill, (e) vLLM's OffloadingConnector CPU hit after an HBM reset.

One request at a time, max_tokens=1, random token ids. Each mode runs in its own process.
Hits (b), (d) and (e) are measured HIT_REPEATS times, each after an HBM reset; the JSON
keeps every time and reports the median.
Usage: python ttft_bench.py MODE [LENGTHS]   (default 4096,16384,32768; $OUT/ttft-MODE.json,
ttft-MODE-tpN.json under GPU_BENCH_TP=N)
GPU_BENCH_NO_L2=1 runs `ours` without L2 (no write-through; the L2 hit is then a miss).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any

import model_8b
import repo_path

SCALE = 1 << 30 if not model_8b.SMOKE else 1 << 20
L1_BYTES = 5 * SCALE
PUSH_BYTES = 6 * SCALE  # other prompts' KV that must pass through L1 to push a prompt out
L2_DIR = None if os.environ.get("GPU_BENCH_NO_L2") == "1" else "/tmp/kvl2"
HIT_REPEATS = 3


class Engine:
    """One LLM instance and its TTFT probe."""

    def __init__(self, mode: str) -> None:
        from vllm import LLM, SamplingParams

        transfer = model_8b.kv_transfer(mode, L1_BYTES if mode == "ours" else 8 * SCALE, L2_DIR)
        args = model_8b.engine_args(max_model_len=65536, gpu_memory_utilization=0.85)
        if transfer is not None:
            args["kv_transfer_config"] = transfer
        start = time.time()
        self.llm = LLM(**args)
        self.startup_s = round(time.time() - start, 1)
        self.params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        self.greedy8 = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def ttft(self, ids: list[int]) -> tuple[float, int]:
        """(milliseconds to the first token, prompt tokens served from a cache)."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = self.llm.generate([{"prompt_token_ids": ids}], self.params, use_tqdm=False)[0]
        return round((time.perf_counter() - start) * 1e3, 1), int(out.num_cached_tokens or 0)

    def tokens(self, ids: list[int]) -> tuple[list[int], int]:
        """(8 greedy tokens, prompt tokens served from a cache)."""
        out = self.llm.generate([{"prompt_token_ids": ids}], self.greedy8, use_tqdm=False)[0]
        return list(out.outputs[0].token_ids), int(out.num_cached_tokens or 0)

    def reset_hbm(self) -> None:
        time.sleep(0.5)  # lets in-flight stores commit (the engine steps until they do)
        self.llm.reset_prefix_cache()
        time.sleep(0.2)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, model_8b.VOCAB) for _ in range(n)]


def measure(engine: Engine, mode: str, n: int) -> dict[str, Any]:
    rng = random.Random(n)
    ids = prompt(rng, n)
    r: dict[str, Any] = {}
    r["cold_ms"], _ = engine.ttft(ids)
    r["hbm_hit_ms"], r["hbm_hit_cached"] = engine.ttft(ids)
    time.sleep(1.0)  # in-flight stores (and L2 writes) of the cold prefill settle
    r["hbm_hit_settled_ms"], _ = engine.ttft(ids)
    key = {"plain": "recompute", "ours": "l1_hit", "native": "cpu_hit"}[mode]
    times, starts = [], []
    for _ in range(HIT_REPEATS):
        engine.reset_hbm()
        starts.append(round(time.time(), 3))  # to line up with the connector's debug lines
        ms, r[f"{key}_cached"] = engine.ttft(ids)
        times.append(ms)
    r[f"{key}_ms_all"] = times
    r[f"{key}_started_at"] = starts
    r[f"{key}_ms"] = statistics.median(times)
    if mode == "ours":
        r["tokens"] = l1_hit_tokens(engine, prompt(rng, n))
        pushers = math.ceil(PUSH_BYTES / (n * model_8b.KV_BYTES_PER_TOKEN))
        for _ in range(pushers):
            engine.ttft(prompt(rng, n))
        engine.reset_hbm()
        r["l2_hit_ms"], r["l2_hit_cached"] = engine.ttft(ids)
        r["l2_hit_pushed_prompts"] = pushers
    other = prompt(rng, n)
    r["cold2_ms"], _ = engine.ttft(other)
    return r


def l1_hit_tokens(engine: Engine, ids: list[int]) -> dict[str, Any]:
    """8 greedy tokens of a new prompt computed cold, then again served from L1 after an
    HBM reset: identical, and how much of the prompt the hit served."""
    cold, _ = engine.tokens(ids)
    engine.reset_hbm()
    hit, cached = engine.tokens(ids)
    return {"identical": cold == hit, "hit_cached": cached, "cold": cold, "hit": hit}


def main() -> None:
    mode = sys.argv[1]
    lengths = [
        int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4096,16384,32768").split(",")
    ]
    repo_path.add_sources()
    model_8b.prepare_environment()
    model_8b.fresh_pools(*([L2_DIR] if L2_DIR else []))  # no hits left over from an earlier run
    engine = Engine(mode)
    result: dict[str, Any] = {"mode": mode, "tp": model_8b.TP, "startup_s": engine.startup_s}
    result["load_mode"] = model_8b.LOAD_MODE
    engine.ttft(prompt(random.Random(1), 512))  # warm-up
    for n in lengths:
        result[str(n)] = measure(engine, mode, n)
        print(n, result[str(n)], flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, model_8b.result_name(f"ttft-{mode}")), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
