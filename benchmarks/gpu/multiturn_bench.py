"""Multi-turn serving under HBM pressure (issue 10), on real vLLM with the 8B-class Llama.

S sessions, each a unique long context; every round appends a user turn to every session
and generates for all of them at once. HBM's KV cache is capped (12 GiB, ~98k tokens) far
below the live context, so without offload every round re-prefills; with a CPU tier the
prefixes come back from host memory. Reports wall time and cached tokens per round.

Usage: python multiturn_bench.py MODE [SESSIONS] [CONTEXT] [ROUNDS]
MODE: plain | ideal (no offload, HBM KV 64 GiB: every session stays resident) | ours |
ours-l2 (L1 16 GiB + L2 40 GiB on local disk) | ours-l1 (the same L1 alone) | native (OffloadingConnector) |
simple (SimpleCPUOffloadConnector). Writes $OUT/multiturn-MODE.json.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import model_8b
import repo_path
import step_timeline

CPU_TIER_BYTES = (1 << 30) if model_8b.SMOKE else (64 << 30)  # the smoke model fits a CPU VM
HBM_KV_BYTES = 12 << 30
IDEAL_HBM_KV_BYTES = 64 << 30
L2_VARIANT_L1_BYTES = 16 << 30
L2_VARIANT_L2_BYTES = 40 << 30
L2_DIR = "/tmp/kvl2-multiturn"

# At import, so engine processes that re-import this module (spawn) record their steps too.
step_timeline.install_from_env()


def main() -> None:
    mode = sys.argv[1]
    sessions = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 6000
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    repo_path.add_sources()
    model_8b.prepare_environment()
    model_8b.fresh_pools(L2_DIR)
    from vllm import LLM, SamplingParams

    hbm = IDEAL_HBM_KV_BYTES if mode == "ideal" else HBM_KV_BYTES
    args = model_8b.engine_args(**{**model_8b.SERVING, "kv_cache_memory_bytes": hbm})
    if mode == "ours-l2":
        transfer = model_8b.kv_transfer("ours", L2_VARIANT_L1_BYTES, L2_DIR, L2_VARIANT_L2_BYTES)
    elif mode == "ours-l1":
        transfer = model_8b.kv_transfer("ours", L2_VARIANT_L1_BYTES)
    else:
        transfer = model_8b.kv_transfer(mode, CPU_TIER_BYTES)
    if transfer is not None:
        args["kv_transfer_config"] = transfer
    start = time.time()
    llm = LLM(**args)
    result: dict[str, Any] = {
        "mode": mode,
        "sessions": sessions,
        "context": context,
        "startup_s": round(time.time() - start, 1),
        "eager": model_8b.EAGER,
        "l1_overflow": model_8b.L1_OVERFLOW,
        "data_path_env": {k: v for k, v in os.environ.items() if k.startswith("VLLM_MARCONI_")},
    }
    rng = random.Random(0)
    history = [[rng.randrange(3, model_8b.VOCAB) for _ in range(context)] for _ in range(sessions)]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    per_round = []
    for r in range(rounds):
        for h in history:
            h.extend(rng.randrange(3, model_8b.VOCAB) for _ in range(200))
        start = time.monotonic()
        outs = llm.generate([{"prompt_token_ids": h} for h in history], params, use_tqdm=False)
        end = time.monotonic()
        wall = end - start
        for h, o in zip(history, outs, strict=True):
            h.extend(o.outputs[0].token_ids)
        prompt = sum(len(o.prompt_token_ids) for o in outs)
        cached = sum(o.num_cached_tokens or 0 for o in outs)
        per_round.append(
            {
                "round": r,
                "wall_s": round(wall, 2),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": round(cached / prompt, 3),
                "start_t": round(start, 6),
                "end_t": round(end, 6),
            }
        )
        print(per_round[-1], flush=True)
    result["rounds"] = per_round
    result["total_wall_s_after_first"] = round(sum(x["wall_s"] for x in per_round[1:]), 2)
    print("RESULT " + json.dumps(result), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"multiturn-{mode}.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
