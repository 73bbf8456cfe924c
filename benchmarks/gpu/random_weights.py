"""Seeded random weights for the benchmark Llama whose first generated token depends on the
whole context.

vLLM's `load_format="dummy"` draws every weight (norms included) from U(-1e-3, 1e-3): each
layer then adds well under 1% to the residual stream and the greedy tokens follow the last
prompt token alone, so comparing tokens proves nothing about the KV a connector loaded.
These weights keep activations at unit scale (linear weights N(0, 1/fan_in), embeddings
N(0, 1), norms 1), so over many layers attention moves the residual stream and the first
token changes with the context, and with wrong or missing KV. Later tokens can part
between two correct runs (bf16 arithmetic of other batch shapes, amplified over the
layers), so KV is compared by first tokens (`context_check.py` checks both on a host).
`write(config, folder)` writes `model.safetensors` shards once per config and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

SEED = 0
MARKER = "random-weights.json"


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim, vocab = int(config["head_dim"]), int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(int(config["num_hidden_layers"])):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.post_attention_layernorm.weight": (hidden,),
            f"{layer}.self_attn.q_proj.weight": (heads * head_dim, hidden),
            f"{layer}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            f"{layer}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            f"{layer}.self_attn.o_proj.weight": (hidden, heads * head_dim),
            f"{layer}.mlp.gate_proj.weight": (inter, hidden),
            f"{layer}.mlp.up_proj.weight": (inter, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inter),
        })  # fmt: skip
    return shapes


def _tensor(name: str, shape: tuple[int, ...], generator: Any, device: str) -> Any:
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    std = 1.0 if name == "model.embed_tokens.weight" else shape[-1] ** -0.5
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    return (values * std).to(torch.bfloat16).cpu()


def write(config: dict[str, Any], folder: str) -> None:
    """Write the weights of `config` into `folder` unless they are there for this config."""
    import torch
    from safetensors.torch import save_file

    stamp = hashlib.sha256(json.dumps([config, SEED, "unit-scale"], sort_keys=True).encode())
    marker = os.path.join(folder, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f).get("stamp") == stamp.hexdigest():
                return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(SEED)
    shard: dict[str, Any] = {}
    index: dict[str, str] = {}
    names = list(_shapes(config).items())
    for position, (name, shape) in enumerate(names):
        shard[name] = _tensor(name, shape, generator, device)
        if sum(t.numel() for t in shard.values()) >= 1 << 30 or position == len(names) - 1:
            file = f"model-{len(set(index.values())):05d}.safetensors"
            save_file(shard, os.path.join(folder, file), metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, file))
            shard = {}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)
    with open(marker, "w") as f:
        json.dump({"stamp": stamp.hexdigest(), "seed": SEED}, f)
