"""Run one real vLLM engine through phases of greedy generation; print the results as JSON.

Usage: python generate.py SPEC.json. The spec names the model, an optional
`kv_transfer_config` and `tensor_parallel_size`, engine sizes (`block_size`,
`kv_cache_memory_bytes`, `max_model_len`, `max_num_batched_tokens`), and phases. A phase
may `pause` first (the driver writes `<pause_dir>/paused-<i>` and waits for
`<pause_dir>/resume-<i>`, so a test can restart a server in between), may reset vLLM's own
prefix cache (`reset_prefix_cache`; with `reset_connector` the connector's too), then
generates for its prompts (lists of token ids; `cache_salts`, one per prompt or null,
sets vLLM's `cache_salt`). The last stdout line is `RESULT <json>`:
per phase, per prompt, the generated token ids and `num_cached_tokens`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

PAUSE_LIMIT_S = 300


def _pause(spec: dict[str, Any], index: int) -> None:
    folder = Path(spec["pause_dir"])
    (folder / f"paused-{index}").touch()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (folder / f"resume-{index}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no resume-{index} after {PAUSE_LIMIT_S} s")
        time.sleep(0.1)


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
    if spec.get("kv_events_config"):
        from vllm.config import KVEventsConfig

        kwargs["kv_events_config"] = KVEventsConfig(**spec["kv_events_config"])
    llm = LLM(**kwargs)
    results = []
    for index, phase in enumerate(spec["phases"]):
        if phase.get("pause"):
            _pause(spec, index)
        if phase.get("reset_prefix_cache") or phase.get("reset_connector"):
            ok = llm.reset_prefix_cache(reset_connector=bool(phase.get("reset_connector")))
            print(f"PHASE {index} reset_prefix_cache -> {ok}", flush=True)
        params = SamplingParams(
            max_tokens=phase.get("max_tokens", 8), temperature=0.0, ignore_eos=True
        )
        salts = phase.get("cache_salts") or [None] * len(phase["prompts"])
        prompts = [
            {"prompt_token_ids": ids, **({"cache_salt": salt} if salt else {})}
            for ids, salt in zip(phase["prompts"], salts, strict=True)
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results.append(
            [
                {"tokens": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens or 0}
                for out in outputs
            ]
        )
        print(f"PHASE {index} cached={[r['cached'] for r in results[-1]]}", flush=True)
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    print("RESULT " + json.dumps(run(spec)), flush=True)
