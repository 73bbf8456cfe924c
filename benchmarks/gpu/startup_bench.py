"""Engine start-up with a CPU tier of GIB GiB and, given LENGTH, TTFT of one prompt of that
many tokens served from HBM and from the CPU tier (issue 34), per mode.

MODE: `ours` (L1 of GIB GiB, no L2, the connector's defaults) | `native` (vLLM's
OffloadingConnector, `cpu_bytes_to_use` GIB GiB) | `lmcache` (LMCache's connector, its CPU
backend of GIB GiB; needs the `lmcache` package). Engine settings: `model_8b.SERVING` (the
multi-turn benchmark's), production mode. Start-up is the time `LLM(...)` takes.
With LENGTH, after a 512-token warm-up: the prompt computed cold; after 2 s (its stores
settle) HBM_REPEATS requests of the same prompt, every block of it in vLLM's own cache;
then CPU_REPEATS requests each after the prompt left HBM (served from the CPU tier): by
default after enough other prompts of LENGTH tokens to fill HBM's KV cache (pushed out, as in
serving; `STARTUP_CPU_EVICT=reset`: vLLM's prefix-cache reset instead). Each CPU-tier
hit's token must equal the HBM hits' (`cpu_tokens_match`): under `GPU_BENCH_WEIGHTS=random`
a hit that skipped its load computes over another prompt's KV and answers otherwise.
One request at a time, max_tokens=1; STARTUP_HBM_REPEATS and STARTUP_CPU_REPEATS (7, 5).
Usage: python startup_bench.py MODE GIB [LENGTH]
(writes $OUT/startup-MODE-GIB-TAG.json, TAG from $STARTUP_TAG, default 0).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from typing import Any

import model_8b
import repo_path
from ttft_bench import prompt

SCALE = 1 << 20 if model_8b.SMOKE else 1 << 30  # GIB means MiB for the smoke model
HBM_REPEATS = int(os.environ.get("STARTUP_HBM_REPEATS", "7"))
CPU_REPEATS = int(os.environ.get("STARTUP_CPU_REPEATS", "5"))
CPU_EVICT = os.environ.get("STARTUP_CPU_EVICT", "fill")
if CPU_EVICT not in ("fill", "reset"):
    raise SystemExit(f"STARTUP_CPU_EVICT={CPU_EVICT!r}; accepted: fill, reset")


def summary(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": statistics.median(times), "p90": p90, "min": ordered[0],
            "max": ordered[-1], "all": times}  # fmt: skip


def measure(llm: Any, length: int, hbm_tokens: int) -> dict[str, Any]:
    import torch
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def ttft(ids: list[int]) -> tuple[float, int, int]:
        """Milliseconds to the first token, cached tokens, the token."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        ms = round((time.perf_counter() - start) * 1e3, 1)
        return ms, int(out.num_cached_tokens or 0), out.outputs[0].token_ids[0]

    def push_out_of_hbm() -> bool:
        """Make vLLM drop the prompt's blocks from HBM; False if it said it could not."""
        if CPU_EVICT == "reset":
            return bool(llm.reset_prefix_cache())
        for filler in fillers:  # LRU: a cycle longer than HBM holds misses every time
            ttft(filler)
        return True

    ttft(prompt(random.Random(1), 512))
    ids = prompt(random.Random(length), length)
    fillers = [prompt(random.Random(-1 - i), length) for i in range(hbm_tokens // length + 1)]
    result: dict[str, Any] = {"cpu_evict": CPU_EVICT, "hbm_fillers": len(fillers)}
    result["cold_ms"], _, _ = ttft(ids)
    time.sleep(2.0)
    hbm, cpu, evicted, hbm_tokens_out, cpu_tokens_out = [], [], [], set(), []
    for _ in range(HBM_REPEATS):
        ms, result["hbm_cached"], token = ttft(ids)
        hbm.append(ms)
        hbm_tokens_out.add(token)
        time.sleep(0.2)
    for _ in range(CPU_REPEATS):
        time.sleep(0.5)  # lets in-flight stores commit
        evicted.append(push_out_of_hbm())
        time.sleep(0.2)
        ms, result["cpu_cached"], token = ttft(ids)
        cpu.append(ms)
        cpu_tokens_out.append(token)
    result["hbm_hit_ms"] = summary(hbm)
    result["cpu_hit_ms"] = summary(cpu)
    result["hbm_evictions_done"] = f"{sum(evicted)}/{len(evicted)}"
    result["hbm_tokens_agree"] = len(hbm_tokens_out) == 1
    matched = sum(t in hbm_tokens_out for t in cpu_tokens_out)
    result["cpu_tokens_match"] = f"{matched}/{len(cpu_tokens_out)}"
    return result


def main() -> None:
    mode, gib = sys.argv[1], int(sys.argv[2])
    length = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    repo_path.add_sources()
    model_8b.prepare_environment()
    model_8b.fresh_pools()
    from vllm import LLM

    args = model_8b.engine_args(**model_8b.SERVING)
    args["kv_transfer_config"] = model_8b.kv_transfer(mode, gib * SCALE)
    start = time.time()
    llm = LLM(**args)
    result: dict[str, Any] = {
        "mode": mode,
        "cpu_gib": gib,
        "load_mode": model_8b.LOAD_MODE or "default",
        "startup_s": round(time.time() - start, 1),
    }
    print("startup", json.dumps(result), flush=True)
    if length:
        result[str(length)] = measure(llm, length, model_8b.hbm_kv_tokens(args))
    print("RESULT " + json.dumps(result), flush=True)
    out = os.environ.get("OUT")
    if out:
        name = f"startup-{mode}-{gib}-{os.environ.get('STARTUP_TAG', '0')}.json"
        with open(os.path.join(out, name), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
