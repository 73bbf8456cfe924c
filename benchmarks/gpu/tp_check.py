"""vllm-marconi-offload at tensor parallelism `GPU_BENCH_TP` with the 8B-class model: tokens
against no offload, L1 hits, L2 hits after pushing the prompt out of L1, hits after an
engine restart, and every rank's pool and layout files.

Three engine processes, one after another (ttft_bench's engine, pools and prompts):
plain (no connector), ours (cold, L1 hit after an HBM reset, L2 hit after other prompts
pushed the prompt out of L1; lists the pool files before it exits) and restart (a new
process on the same pool files).
Usage: GPU_BENCH_TP=2 python tp_check.py [LENGTH]   (default 16384; $OUT/tp-check-tpN.json)
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import model_8b
import repo_path
import ttft_bench

MAX_TOKENS = 8


def generate(engine: ttft_bench.Engine, ids: list[int]) -> dict[str, Any]:
    """Greedy MAX_TOKENS tokens of `ids`: the tokens and the prompt tokens from a cache."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = engine.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    return {"tokens": list(out.outputs[0].token_ids), "cached": int(out.num_cached_tokens or 0)}


def engine_main(role: str, n: int, out_path: str) -> None:
    """One engine: `plain`, `ours` or `restart`; writes its phases to `out_path`."""
    repo_path.add_sources()
    model_8b.prepare_environment()
    rng = random.Random(n)
    ids = ttft_bench.prompt(rng, n)
    engine = ttft_bench.Engine("plain" if role == "plain" else "ours")
    result: dict[str, Any] = {"startup_s": engine.startup_s, "cold": generate(engine, ids)}
    if role == "ours":
        engine.reset_hbm()
        result["l1_hit"] = generate(engine, ids)
        pushers = math.ceil(ttft_bench.PUSH_BYTES / (n * model_8b.KV_BYTES_PER_TOKEN))
        for _ in range(pushers):
            engine.ttft(ttft_bench.prompt(rng, n))
        engine.reset_hbm()
        result["l2_hit"] = generate(engine, ids)
        result["files_while_running"] = pool_files()  # L1 and layouts go at a clean exit
    engine.reset_hbm()  # stores of the last run settle before the process exits
    Path(out_path).write_text(json.dumps(result))


def pool_files() -> dict[str, Any]:
    """Every file of the L1 and L2 directories with its size, and how many different
    layouts the ranks published (1 while an engine runs: they agree)."""
    files: dict[str, int] = {}
    for folder in (model_8b.L1_DIR, ttft_bench.L2_DIR):
        if folder and os.path.isdir(folder):
            for path in sorted(Path(folder).iterdir()):
                files[str(path)] = path.stat().st_size
    layouts = {p.read_text() for p in Path(model_8b.L1_DIR).glob("*.layout")}
    return {"files": files, "distinct_layouts": len(layouts)}


def run_engine(role: str, n: int, out: Path) -> dict[str, Any]:
    result_path = out / f"tp-check-{role}.result.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--engine",
        role,
        str(n),
        str(result_path),
    ]
    with (out / f"tp-check-{role}.log").open("wb") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    print(f"engine {role}: rc={rc}", flush=True)
    if not result_path.exists():
        return {"error": f"engine {role} exited with {rc} without a result"}
    result: dict[str, Any] = json.loads(result_path.read_text())
    result_path.unlink()
    return result


def main() -> int:
    if sys.argv[1:2] == ["--engine"]:
        engine_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    out = Path(os.environ.get("OUT") or "/tmp")
    model_8b.fresh_pools(*([ttft_bench.L2_DIR] if ttft_bench.L2_DIR else []))
    result: dict[str, Any] = {"tp": model_8b.TP, "length": n, "max_tokens": MAX_TOKENS}
    for role in ("plain", "ours"):
        result[role] = run_engine(role, n, out)
    result["files_after_ours"] = pool_files()
    result["restart"] = run_engine("restart", n, out)
    if not any("error" in result[role] for role in ("plain", "ours", "restart")):
        expected = result["plain"]["cold"]["tokens"]
        ours, restart = result["ours"], result["restart"]
        result["summary"] = {
            "tokens_identical": {
                name: run["tokens"] == expected
                for name, run in (
                    ("cold", ours["cold"]),
                    ("l1_hit", ours["l1_hit"]),
                    ("l2_hit", ours["l2_hit"]),
                    ("restart_hit", restart["cold"]),
                )
            },
            "cached": {
                "l1_hit": ours["l1_hit"]["cached"],
                "l2_hit": ours["l2_hit"]["cached"],
                "restart_hit": restart["cold"]["cached"],
            },
            "ranks_publish_one_layout": ours["files_while_running"]["distinct_layouts"] == 1,
        }
    print("RESULT " + json.dumps(result.get("summary")), flush=True)
    (out / model_8b.result_name("tp-check")).write_text(json.dumps(result, indent=1))
    return 0 if "summary" in result else 1


if __name__ == "__main__":
    sys.exit(main())
