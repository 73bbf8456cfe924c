"""Every seed key is accepted and validated; errors name the key and the accepted values."""

from __future__ import annotations

import pytest
from vllm_marconi_offload.config import ConfigError, OffloadConfig


def test_defaults_are_single_tier_anonymous_marconi() -> None:
    config = OffloadConfig.from_extra_config({})
    assert config.cpu_pool_path is None
    assert not config.has_l2
    assert config.eviction_policy == "marconi"
    assert config.eviction_options == {"decay": 0.0, "reuse_mode": "linear"}
    assert config.admission_threshold == 1


def test_seed_quickstart_config_is_accepted() -> None:
    config = OffloadConfig.from_extra_config(
        {
            "cpu_pool_path": "/dev/shm/vllm_kv_l1",
            "cpu_bytes_to_use": 6442450944,
            "l2_pool_path": "/kvcache/vllm_kv_l2",
            "l2_bytes_to_use": 322122547200,
            "eviction_policy": "marconi",
            "eviction_decay": 0.005,
            "eviction_reuse_mode": "log",
            "admission_threshold": 2,
        }
    )
    assert config.has_l2
    assert config.eviction_options == {"decay": 0.005, "reuse_mode": "log"}
    assert config.admission_threshold == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"eviction_policy": "fifo"}, "eviction_policy must be one of ['marconi', 'lru', 'auto']"),
        ({"eviction_reuse_mode": "square"}, "eviction_reuse_mode must be one of"),
        ({"eviction_decay": -0.1}, "eviction_decay must be a finite number >= 0.0"),
        ({"eviction_decay": float("nan")}, "eviction_decay"),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use must be an integer >= 1"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use must be an integer"),
        ({"cpu_bytes_to_use": 1.5}, "cpu_bytes_to_use must be an integer"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use must be an integer"),
        ({"admission_threshold": 0}, "admission_threshold must be an integer >= 1"),
        ({"l2_bytes_to_use": 1 << 30}, "l2_bytes_to_use is set but l2_pool_path is not"),
        ({"l2_pool_path": "/tmp/x"}, "l2_pool_path is set: l2_bytes_to_use must be"),
        ({"cpu_pool_path": ""}, "cpu_pool_path must be a non-empty string"),
        ({"cpu_bytes": 1}, "unknown key(s) ['cpu_bytes']"),
    ],
)
def test_bad_values_name_the_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        OffloadConfig.from_extra_config(extra)
    assert message in str(excinfo.value)


def test_lru_takes_no_marconi_options() -> None:
    config = OffloadConfig.from_extra_config({"eviction_policy": "lru", "eviction_decay": 0.1})
    assert config.eviction_options == {}


@pytest.mark.vllm  # the worker's modules import torch
def test_gpu_data_path_environment_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_marconi_offload.cuda_mover import DEFAULT_STAGING_BYTES, staging_bytes_from_env
    from vllm_marconi_offload.worker import copy_mode_from_env

    monkeypatch.delenv("VLLM_MARCONI_OFFLOAD_STAGING_MIB", raising=False)
    assert staging_bytes_from_env() == DEFAULT_STAGING_BYTES
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_STAGING_MIB", "512")
    assert staging_bytes_from_env() == 512 << 20
    for bad in ("2GiB", "0", "-1"):
        monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_STAGING_MIB", bad)
        with pytest.raises(ConfigError, match=r"VLLM_MARCONI_OFFLOAD_STAGING_MIB.*positive"):
            staging_bytes_from_env()
    monkeypatch.delenv("VLLM_MARCONI_OFFLOAD_COPY", raising=False)
    assert copy_mode_from_env() == "async"
    for mode in ("generic", "direct", "async-per-layer"):
        monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_COPY", mode)
        assert copy_mode_from_env() == mode
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_COPY", "fast")
    with pytest.raises(
        ConfigError, match="accepted values are async, direct, async-per-layer, generic"
    ):
        copy_mode_from_env()
