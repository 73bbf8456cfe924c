"""Where an external KV hit may end on a model with Mamba layers.

vLLM keeps a Mamba group's recurrent state only at multiples of that group's
`block_size` (`cache_config.mamba_block_size`: the scheduler block size in
`align` mode; `max_model_len` with prefix caching off, so no hit can end on a
cached state). A hit that ends anywhere else resumes from a state that does
not exist. So the end of the hit, `num_computed_tokens + hit`, is rounded down to a
multiple of every Mamba group's block size.

Only duck typing is used, so this works with the `KVCacheConfig` of every vLLM from
0.22.1 to 0.33.0 without importing vLLM: `kv_cache_config.kv_cache_groups[i]
.kv_cache_spec` with `block_size`; a Mamba spec is recognised by its class name
(`MambaSpec` or a subclass) or by a `mamba_cache_mode` attribute; specs grouped in
a `kv_cache_specs` mapping (`UniformTypeKVCacheSpecs`) are looked into.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping


def _specs(spec: object) -> Iterator[object]:
    nested = getattr(spec, "kv_cache_specs", None)
    if isinstance(nested, Mapping):
        for inner in nested.values():
            yield from _specs(inner)
    else:
        yield spec


def _is_mamba(spec: object) -> bool:
    return hasattr(spec, "mamba_cache_mode") or any(
        cls.__name__ == "MambaSpec" for cls in type(spec).__mro__
    )


def mamba_alignment_tokens(kv_cache_config: object) -> int | None:
    """Tokens an external hit's end must be a multiple of; None without Mamba layers.

    The least common multiple of the `block_size` of every Mamba spec in
    `kv_cache_config.kv_cache_groups`. Raises `ValueError` on a Mamba spec
    without a positive integer `block_size`.
    """
    sizes: set[int] = set()
    for group in getattr(kv_cache_config, "kv_cache_groups", ()):
        for spec in _specs(getattr(group, "kv_cache_spec", None)):
            if not _is_mamba(spec):
                continue
            size = getattr(spec, "block_size", None)
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ValueError(
                    f"Mamba KV cache spec {type(spec).__name__} has block_size={size!r}; "
                    "expected a positive int"
                )
            sizes.add(size)
    return math.lcm(*sizes) if sizes else None


def aligned_external_hit_tokens(
    num_hit_tokens: int,
    num_computed_tokens: int,
    kv_cache_config: object,
    *,
    num_tokens: int | None = None,
) -> int:
    """The longest prefix of an external hit that is safe to report to the scheduler.

    `num_hit_tokens` is the hit found beyond `num_computed_tokens` (the tokens
    the scheduler already has, as passed to `get_num_new_matched_tokens`). When
    `num_tokens` (the request's `num_tokens`) is given, the hit stops one token
    short of it, so the last token is computed and yields logits. On a model with
    Mamba layers the hit's end is then rounded down to `mamba_alignment_tokens`;
    a result of 0 means "report no external hit". Pure-attention models keep the hit.
    """
    for name, value in (
        ("num_hit_tokens", num_hit_tokens),
        ("num_computed_tokens", num_computed_tokens),
    ):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    end = num_computed_tokens + num_hit_tokens
    if num_tokens is not None:
        end = min(end, num_tokens - 1)
    alignment = mamba_alignment_tokens(kv_cache_config)
    if alignment is not None:
        end -= end % alignment
    return max(end - num_computed_tokens, 0)
