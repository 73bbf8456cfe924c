"""CPU benchmark of the connector on real vLLM (one process, tiny random-weight Llama).

Measures, in one run so the ratios are comparable on a noisy machine:
  * TTFT of a 2k-token prompt: recompute without the connector, recompute with it (cold,
    so the stores are paid), and an L1 hit after vLLM's own prefix cache was reset;
  * connector time per scheduler step and per stored block (time inside the connector's
    hooks, measured by wrapping them), and decode throughput with vs without it.

Usage: python bench_connector.py [--model DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))

import tiny_model  # noqa: E402

PROMPT_TOKENS = 2048
REPEATS = 5


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, tiny_model.SAFE_VOCAB) for _ in range(length)] for _ in range(n)]


def make_llm(model: str, connector: dict[str, Any] | None) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    return LLM(
        model=model, dtype="bfloat16", enforce_eager=True, enable_prefix_caching=True,
        block_size=32, kv_cache_memory_bytes=256 << 20, max_model_len=4096,
        max_num_seqs=8, max_num_batched_tokens=4096, seed=0,
        kv_transfer_config=KVTransferConfig(**connector) if connector else None,
    )  # fmt: skip


def first_token(llm: Any, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token, and the prompt tokens vLLM served from a cache."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    return time.perf_counter() - start, int(out.num_cached_tokens or 0)


def ttft(llm: Any, prompt: list[int]) -> float:
    return first_token(llm, prompt)[0]


def decode(llm: Any, batch: list[list[int]], tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    return time.perf_counter() - start


def instrument(connector_cls: Any) -> dict[str, list[float]]:
    """Wrap the connector's hooks to accumulate the time spent inside each."""
    timings: dict[str, list[float]] = defaultdict(list)
    for name in (
        "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
        "update_connector_output", "start_load_kv", "wait_for_save", "get_finished",
        "build_connector_worker_meta",
    ):  # fmt: skip
        original = getattr(connector_cls, name)

        def wrapper(self: Any, *args: Any, __original: Any = original, __name: str = name) -> Any:
            start = time.perf_counter()
            try:
                return __original(self, *args)
            finally:
                timings[__name].append(time.perf_counter() - start)

        setattr(connector_cls, name, wrapper)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=Path(".work/bench/tiny-llama"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model = str(tiny_model.build(args.model.resolve(), "llama"))
    connector = {
        "kv_connector": "MarconiOffloadConnector",
        "kv_connector_module_path": "vllm_marconi_offload",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 512 << 20},
    }
    long_prompts = prompts(REPEATS + 1, PROMPT_TOKENS + 1, seed=1)
    decode_batch = prompts(8, 64, seed=2)

    plain = make_llm(model, None)
    ttft(plain, long_prompts[-1])  # warm-up
    recompute_plain = [ttft(plain, p) for p in long_prompts[:REPEATS]]
    decode_plain = decode(plain, decode_batch, 128)
    del plain

    from vllm_marconi_offload import MarconiOffloadConnector

    timings = instrument(MarconiOffloadConnector)
    llm = make_llm(model, connector)
    ttft(llm, long_prompts[-1])
    recompute_ours = [ttft(llm, p) for p in long_prompts[:REPEATS]]
    hits = []
    for p in long_prompts[:REPEATS]:
        llm.reset_prefix_cache()
        hits.append(ttft(llm, p))
    timings.clear()
    decode_ours = decode(llm, decode_batch, 128)
    steps = len(timings["build_connector_meta"])
    per_step = sum(sum(v) for v in timings.values()) / max(steps, 1)
    per_hook = {name: 1e6 * sum(v) / max(steps, 1) for name, v in timings.items()}

    # Store cost per block: a cold 2k prompt stores 64 blocks in one wait_for_save.
    timings.clear()
    fresh = prompts(REPEATS, PROMPT_TOKENS + 1, seed=3)
    for p in fresh:
        ttft(llm, p)
    blocks = REPEATS * (PROMPT_TOKENS // 32)
    store_side = sum(timings["build_connector_meta"]) + sum(timings["update_connector_output"])
    per_block_us = 1e6 * (sum(timings["wait_for_save"]) + store_side) / blocks

    med = statistics.median
    result = {
        "prompt_tokens": PROMPT_TOKENS,
        "ttft_recompute_no_connector_ms": 1000 * med(recompute_plain),
        "ttft_recompute_with_connector_ms": 1000 * med(recompute_ours),
        "ttft_l1_hit_ms": 1000 * med(hits),
        "l1_hit_speedup_vs_recompute": med(recompute_plain) / med(hits),
        "cold_prefill_overhead_pct": 100 * (med(recompute_ours) / med(recompute_plain) - 1),
        "connector_us_per_decode_step": 1e6 * per_step,
        "decode_seconds_no_connector": decode_plain,
        "decode_seconds_with_connector": decode_ours,
        "decode_slowdown_pct": 100 * (decode_ours / decode_plain - 1),
        **{f"us_per_step_{name}": value for name, value in sorted(per_hook.items())},
        "store_us_per_block": per_block_us,
        "block_bytes": 32 * 1024,
    }
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(
            f"{key:<{width}}  {value:.2f}"
            if isinstance(value, float)
            else f"{key:<{width}}  {value}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
