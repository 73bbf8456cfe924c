"""Build tiny random-weight models that real vLLM can serve offline on a CPU.

Nothing is downloaded: the tokenizer is trained here on generated text and the weights
are random. `python tools/tiny_model.py DIR [--kind llama|qwen3-next]`.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SAFE_VOCAB = 700
"""Token ids below this are valid for every model built here (the BPE has ~750 tokens)."""

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "cache",
    "block",
    "token",
    "prefix",
    "layer",
    "head",
    "value",
    "key",
    "store",
    "load",
    "evict",
    "tier",
    "disk",
    "memory",
    "request",
    "server",
    "model",
    "agent",
    "system",
    "prompt",
    "turn",
    "reply",
    "context",
    "query",
    "answer",
    "vector",
    "tensor",
    "kernel",
    "stream",
    "queue",
    "batch",
    "slot",
    "page",
    "file",
    "index",
    "chain",
    "policy",
]


def _corpus(lines: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [
            rng.choice(WORDS) + rng.choice(("", "s", "ed", "ing", str(rng.randint(0, 99))))
            for _ in range(rng.randint(8, 24))
        ]
        out.append(" ".join(words))
    return out


def build_tokenizer(folder: Path) -> int:
    """Train a byte-level BPE tokenizer into `folder`; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<s>", "</s>", "<pad>"], show_progress=False
    )
    tokenizer.train_from_iterator(_corpus(2000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    return len(fast)


def build(folder: Path, kind: str = "llama", seed: int = 0) -> Path:
    """Write tokenizer, config and random bf16 weights of a tiny model into `folder`."""
    import torch
    import transformers

    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(folder)
    torch.manual_seed(seed)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=4096, tie_word_embeddings=False,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    elif kind == "qwen3-next":
        config = transformers.Qwen3NextConfig(
            vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            # small linear-attention state, so vLLM's aligned block size stays small
            linear_num_key_heads=2, linear_num_value_heads=2,
            linear_key_head_dim=64, linear_value_head_dim=64,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, max_position_embeddings=4096,
            tie_word_embeddings=False,
        )  # fmt: skip
        model = transformers.Qwen3NextForCausalLM(config)
    else:
        raise ValueError(f"kind must be 'llama' or 'qwen3-next', got {kind!r}")
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bar
    model.to(torch.bfloat16).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--kind", default="llama", choices=("llama", "qwen3-next"))
    args = parser.parse_args()
    print(build(args.folder, args.kind))


if __name__ == "__main__":
    main()
