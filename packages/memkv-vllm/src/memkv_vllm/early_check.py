"""memkv-vllm's settings checked where the user's program builds vLLM's configuration.

`install` (called by `memkv_vllm.register`) hooks `check_vllm_config` into
`EngineArgs.create_engine_config` (`vllm_kv_identity.early_check`): a bad value of any
memkv-vllm setting, in the tier entry, in the direct spec's `kv_connector_extra_config`,
in `MEMKV_CONFIG` or in a `MEMKV_*` variable, and the memkv tier on a CPU-only vLLM,
stop the program seconds after start with one line naming the key, the value and the
accepted form, before vLLM starts its engine. The same settings checks run again where
the settings are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import DirectConfig, TierConfig
from .errors import ConfigError
from .store import StoreConfig, store_keys

__all__ = [
    "CPU_ONLY_TIER",
    "CpuOnlyTierError",
    "check_vllm_config",
    "configured_stores",
    "install",
]

CPU_ONLY_TIER = (
    'memkv-vllm: the memkv tier ("type": "memkv" in secondary_tiers) needs a CUDA or XPU '
    "GPU: vLLM's TieringOffloadingSpec keeps a CPU pool in front of it that runs only next "
    'to one, and this vLLM runs on CPU only; use direct mode instead: "spec_name": '
    '"MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec"'
)

DIRECT_SPEC = ("MemKVOffloadingSpec", "memkv_vllm.spec")
VLLM_TIERING_SPEC = "TieringOffloadingSpec"  # vLLM's own: its CPU pool needs a GPU


class CpuOnlyTierError(RuntimeError):
    """The memkv tier under vLLM's own tiering spec on a CPU-only vLLM (whose CPU-pool
    worker would fail later with "CPU Offloading is currently only supported on
    CUDA-alike and XPU GPUs")."""


def cpu_only_platform() -> bool:
    """Whether this vLLM runs on neither a CUDA-alike nor an XPU GPU."""
    from vllm.platforms import current_platform  # type: ignore[import-not-found]

    return not (current_platform.is_cuda_alike() or current_platform.is_xpu())


def configured_stores(
    extra: Mapping[str, Any], tier_type: str = "memkv"
) -> list[tuple[str, StoreConfig]]:
    """Validate memkv-vllm's settings in `kv_connector_extra_config` (and `MEMKV_CONFIG`,
    `MEMKV_*`): the store of the direct spec (`("direct", store)`) and of each memkv tier
    (`("tier", store)`), in that order. Raises `ConfigError` (or memkv-client's, for its own settings) for a bad value."""
    stores: list[tuple[str, StoreConfig]] = []
    spec = (extra.get("spec_name"), extra.get("spec_module_path"))
    if spec[0] == DIRECT_SPEC[0] or spec[1] == DIRECT_SPEC[1]:
        DirectConfig.from_extra_config(extra)
        stores.append(("direct", StoreConfig.resolve(extra, "kv_connector_extra_config", "memkv_")))
    tiers = extra.get("secondary_tiers")
    for tier in tiers if isinstance(tiers, list) else []:
        if not isinstance(tier, dict) or tier.get("type") != tier_type:
            continue
        TierConfig.from_dict(tier)
        ours = {k: v for k, v in tier.items() if k in store_keys("")}
        stores.append(("tier", StoreConfig.resolve(ours, "secondary_tiers[memkv]")))
    return stores


def check_vllm_config(vllm_config: Any, tier_type: str = "memkv") -> None:
    """Raise `ConfigError` (or memkv-client's, for its own settings) for a bad memkv-vllm
    setting, `CpuOnlyTierError` for the tier on a CPU-only vLLM; nothing if memkv-vllm is
    not configured."""
    transfer = vllm_config.kv_transfer_config
    extra = (transfer.kv_connector_extra_config if transfer is not None else None) or {}
    tiers = [mode for mode, _ in configured_stores(extra, tier_type) if mode == "tier"]
    spec = (extra.get("spec_name"), extra.get("spec_module_path"))
    if tiers and spec == (VLLM_TIERING_SPEC, None) and cpu_only_platform():
        raise CpuOnlyTierError(CPU_ONLY_TIER)


def _one_line(error: BaseException) -> str:
    text = str(error)
    return f"ERROR {text}" if text.startswith("memkv") else f"ERROR memkv-vllm: {text}"


def install(tier_type: str) -> None:
    """Check memkv-vllm's settings whenever vLLM builds its configuration (idempotent)."""
    import memkv_client
    from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found]
    from vllm_kv_identity.early_check import check_at_config_build

    errors = (ConfigError, memkv_client.ConfigError, CpuOnlyTierError)
    check_at_config_build(
        EngineArgs,
        "memkv-vllm",
        lambda config: check_vllm_config(config, tier_type),
        errors,
        _one_line,
    )
