"""Run one real vLLM engine through phases of greedy generation; print the results as JSON.

Usage: python generate.py SPEC.json. The spec names the model, an optional
`kv_transfer_config` and `tensor_parallel_size`, and phases: each phase optionally resets
vLLM's own prefix cache (and, with `reset_connector`, the connector's), then generates for
its prompts (lists of token ids). The last stdout line is `RESULT <json>`: per phase, per prompt, the generated
token ids and `num_cached_tokens`.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def run(spec: dict[str, Any]) -> list[list[dict[str, Any]]]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {
        "model": spec["model"],
        "dtype": "bfloat16",
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "block_size": spec.get("block_size", 32),
        "kv_cache_memory_bytes": spec.get("kv_cache_memory_bytes", 64 << 20),
        "max_model_len": spec.get("max_model_len", 4096),
        "max_num_seqs": 8,
        "max_num_batched_tokens": spec.get("max_num_batched_tokens", 4096),
        "seed": 0,
        "tensor_parallel_size": spec.get("tensor_parallel_size", 1),
    }
    if spec.get("kv_transfer_config"):
        kwargs["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer_config"])
    llm = LLM(**kwargs)
    results = []
    for phase in spec["phases"]:
        if phase.get("reset_prefix_cache"):
            llm.reset_prefix_cache(reset_connector=phase.get("reset_connector", False))
        params = SamplingParams(
            max_tokens=phase.get("max_tokens", 8), temperature=0.0, ignore_eos=True
        )
        prompts = [{"prompt_token_ids": ids} for ids in phase["prompts"]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results.append(
            [
                {"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens or 0}
                for out in outputs
            ]
        )
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    print("RESULT " + json.dumps(run(spec)), flush=True)
