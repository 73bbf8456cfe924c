"""The random-weight 8B-class Llama used by the GPU benchmarks, and engine settings they share.

Its weights are random: by default seeded ones whose tokens depend on the whole context
(`random_weights.py`, written once per host, ~16 GB for the 8B), so a run's tokens can be
compared with another mode's; `GPU_BENCH_WEIGHTS=dummy` uses vLLM's `load_format="dummy"`
instead (nothing written, but the tokens then follow the last prompt token alone).
KV per token: 32 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 128 KiB.
`GPU_BENCH_SMOKE=1` swaps in a 2-layer toy model so the scripts' logic can be checked on
CPU vLLM before spending device time. `GPU_BENCH_TP=N` runs every engine at tensor
parallelism N (results files get a `-tpN` suffix).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

MODEL_DIR = "/tmp/model-8b"
VOCAB = 32000
# Named L1 directory: with an anonymous L1 (no cpu_pool_path) the connector unlinks the file
# names once mapped, and kvpool-mmap's periodic "L1 file re-created" check (every 256
# scheduler ticks) then mistakes the missing name for a re-created file and turns
# offloading off (seen on the H200, docs/benchmarks.md).
L1_DIR = "/dev/shm/marconi-bench-l1"
# `GPU_BENCH_L1_OVERFLOW=demote` runs ours with the seed's full-L1 behaviour (the
# connector's `l1_overflow` key; default: the connector's default, "demote").
L1_OVERFLOW = os.environ.get("GPU_BENCH_L1_OVERFLOW")
# `GPU_BENCH_LOAD_MODE=async` (or `same_step`, `layer_wise`) runs ours with the connector's `load_mode` key set so.
LOAD_MODE = os.environ.get("GPU_BENCH_LOAD_MODE")
# `GPU_BENCH_EVICTION_POLICY=marconi` (or `lru`, ...) sets the connector's `eviction_policy`.
EVICTION_POLICY = os.environ.get("GPU_BENCH_EVICTION_POLICY")

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": VOCAB,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


SERVING = {"max_model_len": 65536, "kv_cache_memory_bytes": 12 << 30, "max_num_seqs": 64}
"""Engine settings of the multi-turn and start-up benchmarks (HBM KV capped at 12 GiB): equal
settings let their engines share one torch.compile cache."""

WEIGHTS = os.environ.get("GPU_BENCH_WEIGHTS", "random")
if WEIGHTS not in ("random", "dummy"):
    raise SystemExit(f"GPU_BENCH_WEIGHTS={WEIGHTS!r}; accepted: random, dummy")
SMOKE = os.environ.get("GPU_BENCH_SMOKE") == "1"
EAGER = os.environ.get("GPU_BENCH_EAGER") == "1"
TP = int(os.environ.get("GPU_BENCH_TP", "1"))
"""Tensor-parallel size of every engine (`GPU_BENCH_TP=2`: two GPUs, 4 KV heads a rank)."""
if SMOKE:
    CONFIG.update(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )
    MODEL_DIR = "/tmp/model-smoke"

KV_BYTES_PER_TOKEN = (
    int(CONFIG["num_hidden_layers"])
    * int(CONFIG["num_key_value_heads"])
    * int(CONFIG["head_dim"])
    * 4
)


def prepare_environment() -> str:
    """Write the model folder and set the variables vLLM needs on the GPU host."""
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not in the kit
    os.makedirs(MODEL_DIR, exist_ok=True)
    with open(os.path.join(MODEL_DIR, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    if WEIGHTS == "random":
        import random_weights

        random_weights.write(CONFIG, MODEL_DIR)
    return MODEL_DIR


def hbm_kv_tokens(args: dict[str, Any]) -> int:
    """Tokens of KV the engine of `args` (`engine_args`) holds in HBM per rank."""
    return int(args["kv_cache_memory_bytes"]) // (KV_BYTES_PER_TOKEN // TP)


def fresh_pools(*dirs: str) -> None:
    """Remove our L1 directory and `dirs` (L2) so a run starts with no stored blocks."""
    for path in (L1_DIR, *dirs):
        shutil.rmtree(path, ignore_errors=True)


def engine_args(**overrides: Any) -> dict[str, Any]:
    """LLM(...) keyword arguments common to every mode."""
    args: dict[str, Any] = {
        "model": MODEL_DIR,
        "skip_tokenizer_init": True,
        "load_format": "dummy" if WEIGHTS == "dummy" else "safetensors",
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
        "seed": 0,
        "enforce_eager": EAGER,
        "max_num_batched_tokens": 16384,
        "tensor_parallel_size": TP,
    }
    args.update(overrides)
    if SMOKE:
        args.update(kv_cache_memory_bytes=256 << 20, max_model_len=8192, enforce_eager=True)
        args.pop("gpu_memory_utilization", None)
    return args


def kv_transfer(
    mode: str, cpu_bytes: int, l2_dir: str | None = None, l2_bytes: int | None = None
) -> Any:
    """The KVTransferConfig of `mode`: ours, native (OffloadingConnector), simple, lmcache
    (LMCache's own connector, CPU backend of `cpu_bytes`), or none.
    Ours gets an L2 in `l2_dir` of `l2_bytes` (default 4x `cpu_bytes`) if `l2_dir` is set."""
    from vllm.config import KVTransferConfig

    if mode == "ours":
        extra: dict[str, Any] = {
            "cpu_pool_path": L1_DIR,
            "cpu_bytes_to_use": cpu_bytes,
            "hit_log_interval": 1,
        }
        if l2_dir is not None:
            extra.update(l2_pool_path=l2_dir, l2_bytes_to_use=l2_bytes or 4 * cpu_bytes)
        return KVTransferConfig(
            kv_connector="MarconiOffloadConnector",
            kv_connector_module_path="vllm_marconi_offload",
            kv_role="kv_both",
            kv_connector_extra_config={**extra, **env_settings()},
        )
    if mode == "lmcache":  # LMCache's CPU backend, configured through its environment
        os.environ.setdefault("LMCACHE_LOCAL_CPU", "True")
        os.environ.setdefault("LMCACHE_MAX_LOCAL_CPU_SIZE", str(cpu_bytes / (1 << 30)))
        os.environ.setdefault("LMCACHE_CHUNK_SIZE", "256")
        return KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both")
    if mode in ("native", "simple"):
        name = "OffloadingConnector" if mode == "native" else "SimpleCPUOffloadConnector"
        return KVTransferConfig(
            kv_connector=name,
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": cpu_bytes},
        )
    return None


def result_name(stem: str) -> str:
    """`stem`.json, or `stem`-tpN.json when engines run at tensor parallelism N > 1."""
    return f"{stem}-tp{TP}.json" if TP > 1 else f"{stem}.json"


def env_settings() -> dict[str, str]:
    """Ours' `l1_overflow`, `load_mode` and `eviction_policy` settings from
    GPU_BENCH_L1_OVERFLOW, GPU_BENCH_LOAD_MODE and GPU_BENCH_EVICTION_POLICY, where set."""
    keys = {
        "l1_overflow": L1_OVERFLOW,
        "load_mode": LOAD_MODE,
        "eviction_policy": EVICTION_POLICY,
    }
    return {key: value for key, value in keys.items() if value}
