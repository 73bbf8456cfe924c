"""Does load-or-recompute keep an L2 hit from costing more than recomputing it? (CPU vLLM)

On a CPU, prefill of a tiny model is fast and every L2 block is a separate disk read, so
L2 hits are often slower than recomputing: the case the rule exists for. One run measures,
for the same prompts, each in its own engine (so the ratios are comparable):

  * recompute: TTFT of the prompt with no connector;
  * rule: TTFT of the prompt served (or not) from L2 with the connector as shipped;
  * always-load: the same with the decision forced to load (what a connector without the
    rule does);
  * fresh: in each connector engine, after every measured request and the same idle gap,
    a prompt it has never seen (a cold prefill with the connector's stores and L2 traffic
    around it: the reference for "recompute" inside that engine).

Each prompt is stored, pushed out of a small L1 by other prompts, then requested again
after vLLM's own prefix cache is reset. Usage: python bench_l2_decision.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_connector import PROMPT_TOKENS, first_token, make_llm, prompts, tiny_model, ttft

HITS = 8
PUSHERS = 3  # prompts that pass through L1 after each measured one (L1 holds two)
L1_BYTES = 4 << 20  # two 2k-token prompts of the tiny model (1 KiB of KV per token)


def connector(l2_dir: Path) -> dict[str, Any]:
    return {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": L1_BYTES,
            "l2_pool_path": str(l2_dir),
            "l2_bytes_to_use": 256 << 20,
            "eviction_policy": "lru",
        },
    }


def l2_hits(
    model: str, measured: list[list[int]], fillers: list[list[int]], fresh: list[list[int]]
) -> dict[str, Any]:
    """TTFT of each measured prompt's second request, after it was pushed out of L1, and
    the tokens it got from the cache (0 where the rule chose to recompute)."""
    with tempfile.TemporaryDirectory(prefix="bench-l2-") as tmp:
        llm = make_llm(model, connector(Path(tmp)))
        ttft(llm, fillers[-1])  # warm-up
        out: dict[str, Any] = {"ttft_ms": [], "cached_tokens": [], "fresh_ttft_ms": []}
        for i, p in enumerate(measured):
            ttft(llm, p)
            for q in fillers[i * PUSHERS : (i + 1) * PUSHERS]:
                ttft(llm, q)
            time.sleep(0.3)  # lets the write-throughs land
            llm.reset_prefix_cache()
            seconds, cached = first_token(llm, p)
            out["ttft_ms"].append(1000 * seconds)
            out["cached_tokens"].append(cached)
            time.sleep(0.3)  # the same idle gap before the reference as before the hit
            llm.reset_prefix_cache()
            out["fresh_ttft_ms"].append(1000 * ttft(llm, fresh[i]))
        del llm
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path(".work/bench/tiny-llama"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model = str(tiny_model.build(args.model.resolve(), "llama"))
    measured = prompts(HITS, PROMPT_TOKENS + 1, seed=11)
    fillers = prompts(HITS * PUSHERS + 1, PROMPT_TOKENS + 1, seed=12)
    fresh = prompts(HITS, PROMPT_TOKENS + 1, seed=13)

    plain = make_llm(model, None)
    ttft(plain, fillers[-1])
    recompute = [1000 * ttft(plain, p) for p in measured]
    del plain

    rule = l2_hits(model, measured, fillers, fresh)
    from vllm_marconi_offload.cost import LoadCostModel

    LoadCostModel.blocks_to_load = lambda self, blocks, l2_bytes, tokens: blocks  # type: ignore[method-assign]
    always = l2_hits(model, measured, fillers, fresh)

    med = statistics.median
    later = slice(1, None)  # the first L2 hit is always loaded: it measures the disk
    result = {
        "prompt_tokens": PROMPT_TOKENS,
        "recompute_ms": recompute,
        "rule": rule,
        "always_load": always,
        "median_recompute_ms": med(recompute[later]),
        "median_rule_ms": med(rule["ttft_ms"][later]),
        "median_always_load_ms": med(always["ttft_ms"][later]),
        "median_fresh_in_rule_engine_ms": med(rule["fresh_ttft_ms"][later]),
        "rule_vs_fresh": med(rule["ttft_ms"][later]) / med(rule["fresh_ttft_ms"][later]),
        "rule_vs_recompute": med(rule["ttft_ms"][later]) / med(recompute[later]),
        "always_load_vs_recompute": med(always["ttft_ms"][later]) / med(recompute[later]),
    }
    for key in (
        "median_recompute_ms",
        "median_fresh_in_rule_engine_ms",
        "median_rule_ms",
        "median_always_load_ms",
    ):
        print(f"{key:<32} {result[key]:8.1f}")
    print(f"{'rule / fresh (same engine)':<32} {result['rule_vs_fresh']:8.2f}")
    print(f"{'rule / recompute':<32} {result['rule_vs_recompute']:8.2f}")
    print(f"{'always-load / recompute':<32} {result['always_load_vs_recompute']:8.2f}")
    print(f"rule: cached tokens {rule['cached_tokens']}")
    print(f"always-load: cached tokens {always['cached_tokens']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
