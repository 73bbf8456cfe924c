"""Whether the benchmark model's tokens can tell wrong KV from right KV (no offload).

Greedy 16 tokens for PROMPTS prompts of LENGTH tokens that end in the same 8 tokens, then
each prompt again (its KV from vLLM's prefix cache). Passes when the first tokens differ
from one another (they depend on the context before the shared end, so KV loaded wrong or
not at all changes them) and each repeat's first token equals its cold run's (a cache hit
gives the cold run's answer); how many of the 16 tokens the repeats kept is reported.
Usage: python context_check.py [LENGTH] [PROMPTS] (defaults 2000, 4); exit 1 when it
fails; writes $OUT/context-check.json.
"""

from __future__ import annotations

import json
import os
import random
import sys

import model_8b
import repo_path
from ttft_bench import prompt


def main() -> None:
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    repo_path.add_sources()
    model_8b.prepare_environment()
    from vllm import LLM, SamplingParams

    llm = LLM(**model_8b.engine_args(max_model_len=max(4096, 2 * length)))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    end = prompt(random.Random(-7), 8)
    prompts = [prompt(random.Random(1000 + i), length - 8) + end for i in range(count)]

    def tokens(ids: list[int]) -> list[int]:
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        return list(out.outputs[0].token_ids)

    answers = [tokens(ids) for ids in prompts]
    repeats = [tokens(ids) for ids in prompts]
    result = {
        "weights": model_8b.WEIGHTS,
        "prompts": count,
        "distinct_first_tokens": len({a[0] for a in answers}),
        "repeats_first_token_equal": sum(
            a[0] == r[0] for a, r in zip(answers, repeats, strict=True)
        ),
        "repeats_tokens_kept": [
            sum(x == y for x, y in zip(a, r, strict=True))
            for a, r in zip(answers, repeats, strict=True)
        ],
        "answers": answers,
    }
    result["passed"] = (
        result["distinct_first_tokens"] == count and result["repeats_first_token_equal"] == count
    )
    print("RESULT " + json.dumps(result), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "context-check.json"), "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
