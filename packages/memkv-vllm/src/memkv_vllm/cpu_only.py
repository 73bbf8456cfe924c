"""One clear line when the memkv tier is configured on a CPU-only vLLM.

vLLM's `TieringOffloadingSpec` keeps a CPU pool in front of every secondary tier, and its
worker (`CPUOffloadingSpec.get_worker`) runs only next to a CUDA or XPU GPU: on a
CPU-only vLLM it fails with "CPU Offloading is currently only supported on CUDA-alike
and XPU GPUs", before any memkv-vllm code runs, and no public hook comes earlier. So on
such a platform `guard_tier_on_cpu` (called by `memkv_vllm.register`) wraps the spec's
`__init__` to stop with `CPU_ONLY_TIER` instead, naming the mode that does work there.
A spec that brings its own worker (overrides `get_worker`) is left alone. vLLM 0.26 -
0.33: the wrapped names exist in all of them; if they do not, nothing is wrapped.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CPU_ONLY_TIER", "guard_tier_on_cpu"]

CPU_ONLY_TIER = (
    'memkv-vllm: the memkv tier ("type": "memkv" in secondary_tiers) needs a CUDA or XPU '
    "GPU: vLLM's TieringOffloadingSpec keeps a CPU pool in front of it that runs only next "
    'to one, and this vLLM runs on CPU only; use direct mode instead: "spec_name": '
    '"MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec"'
)


def guard_tier_on_cpu(tier_type: str) -> None:
    """On a CPU-only vLLM, make a tiering spec with a `tier_type` tier and vLLM's own CPU
    worker raise `RuntimeError(CPU_ONLY_TIER)` when built (idempotent)."""
    try:
        from vllm.platforms import current_platform  # type: ignore[import-not-found]
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec  # type: ignore[import-not-found]
        from vllm.v1.kv_offload.tiering.spec import (  # type: ignore[import-not-found]
            TieringOffloadingSpec,
        )
    except ImportError:
        return
    if current_platform.is_cuda_alike() or current_platform.is_xpu():
        return
    original = TieringOffloadingSpec.__init__
    if getattr(original, "memkv_cpu_guard", False):
        return

    def guarded_init(spec: Any, *args: Any, **kwargs: Any) -> None:
        original(spec, *args, **kwargs)
        tiers = [t.get("type") for t in spec.secondary_tier_configs if isinstance(t, dict)]
        if tier_type in tiers and type(spec).get_worker is CPUOffloadingSpec.get_worker:
            raise RuntimeError(CPU_ONLY_TIER)

    guarded_init.memkv_cpu_guard = True  # type: ignore[attr-defined]
    TieringOffloadingSpec.__init__ = guarded_init  # type: ignore[method-assign,assignment]
