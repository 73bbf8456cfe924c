"""Every seed key is accepted and validated; errors name the key and the accepted values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kv_eviction import MarconiPolicy, make_policy, register_policy
from kv_eviction.lru import LRUPolicy
from vllm_marconi_offload.config import CONFIG_FILE_ENV, ConfigError, OffloadConfig


def test_defaults_are_single_tier_anonymous_auto() -> None:
    config = OffloadConfig.from_extra_config({})
    assert config.cpu_pool_path is None
    assert not config.has_l2
    assert config.eviction_policy == "auto"
    assert config.eviction_options == {}
    assert config.admission_threshold == 1
    assert config.l1_overflow == "demote"
    assert config.load_mode == "auto"


def test_marconi_when_asked_for_is_the_seeds() -> None:
    config = OffloadConfig.from_extra_config({"eviction_policy": "marconi"})
    policy = make_policy(config.eviction_policy, **config.eviction_options)
    assert isinstance(policy, MarconiPolicy)
    assert (policy.decay, policy.reuse_mode) == (0.0, "linear")


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
        (
            {"eviction_policy": "fifo"},
            "eviction_policy: eviction policy 'fifo' is unknown; accepted values: auto, ",
        ),
        (
            {"eviction_policy": "marconi", "eviction_reuse_mode": "square"},
            "eviction_policy / eviction_reuse_mode: option 'reuse_mode' must be one of",
        ),
        (
            {"eviction_policy": "marconi", "eviction_decay": -0.1},
            "eviction_policy / eviction_decay: option 'decay' must be",
        ),
        ({"eviction_policy": "marconi", "eviction_decay": float("nan")}, "eviction_decay"),
        (
            {"eviction_options": {"smoothing": 1.5}},
            "eviction_policy / eviction_options: option 'smoothing' must be a number in [0, 1)",
        ),
        ({"eviction_options": [1]}, "eviction_options must be a mapping"),
        (
            {"eviction_policy": "marconi", "eviction_decay": 0.1, "eviction_options": {"decay": 0}},
            "eviction_decay and eviction_options['decay'] both set",
        ),
        ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use must be a byte count in [1, 2^60]"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use must be a byte count"),
        ({"cpu_bytes_to_use": 1.5}, "cpu_bytes_to_use must be a byte count"),
        ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use must be a byte count"),
        ({"admission_threshold": 0}, "admission_threshold must be an integer >= 1"),
        ({"l2_bytes_to_use": 1 << 30}, "l2_bytes_to_use is set but l2_pool_path is not"),
        ({"l2_pool_path": "/tmp/x"}, "l2_pool_path is set: l2_bytes_to_use must be"),
        ({"cpu_pool_path": ""}, "cpu_pool_path must be an absolute directory path"),
        ({"cpu_bytes": 1}, "unknown key(s) ['cpu_bytes']"),
        ({"l1_overflow": "refuse"}, "l1_overflow must be one of ['drop_unwritten', 'demote']"),
        (
            {"load_mode": "sync"},
            "load_mode must be one of ['auto', 'async', 'same_step', 'layer_wise'], got 'sync'",
        ),
    ],
)
def test_bad_values_name_the_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        OffloadConfig.from_extra_config(extra)
    assert message in str(excinfo.value)


def test_marconi_aliases_with_another_policy_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = OffloadConfig.from_extra_config({"eviction_decay": 0.1})  # auto, the default
    assert config.eviction_options == {}
    assert "eviction_decay is ignored: eviction_policy='auto'" in caplog.text


def test_lru_takes_no_marconi_options(caplog: pytest.LogCaptureFixture) -> None:
    config = OffloadConfig.from_extra_config({"eviction_policy": "lru", "eviction_decay": 0.1})
    assert config.eviction_options == {}
    assert "eviction_decay is ignored: eviction_policy='lru' takes no Marconi options" in (
        caplog.text
    )


def test_storage_keys_without_l2_are_reported_ignored(caplog: pytest.LogCaptureFixture) -> None:
    OffloadConfig.from_extra_config({"l2_fsync": "always", "l1_overflow": "demote"})
    assert "l2_fsync is ignored: there is no L2" in caplog.text
    assert "l1_overflow is ignored: there is no L2" in caplog.text


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8GiB", 8 << 30),
        ("8 GiB", 8 << 30),
        ("512MiB", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("8GB", 8 << 30),  # one rule in every package: units are binary
        ("8G", 8 << 30),
        ("1073741824", 1 << 30),
        (1 << 30, 1 << 30),
        (1073741824.0, 1 << 30),
    ],
)
def test_byte_sizes_accept_unit_strings(text: object, size: int) -> None:
    config = OffloadConfig.from_extra_config(
        {"cpu_bytes_to_use": text, "l2_pool_path": "/l2", "l2_bytes_to_use": text}
    )
    assert config.cpu_bytes_to_use == size
    assert config.l2_bytes_to_use == size


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"cpu_bytes_to_use": float("inf")}, "cpu_bytes_to_use must be a byte count in [1, 2^60]"),
        ({"cpu_bytes_to_use": float("-inf")}, "cpu_bytes_to_use must be a byte count"),
        ({"cpu_bytes_to_use": float("nan")}, "cpu_bytes_to_use must be a byte count"),
        ({"cpu_bytes_to_use": 1 << 63}, "cpu_bytes_to_use must be a byte count in [1, 2^60]"),
        ({"cpu_bytes_to_use": 1e30}, "cpu_bytes_to_use must be a byte count"),
        ({"cpu_bytes_to_use": "-1GiB"}, "cpu_bytes_to_use must be a byte count"),
        ({"l2_pool_path": "/l2", "l2_bytes_to_use": "2EiB"}, "l2_bytes_to_use must be"),
        ({"admission_threshold": float("inf")}, "admission_threshold must be an integer >= 1"),
        ({"hit_log_interval": float("nan")}, "hit_log_interval must be an integer >= 1"),
        ({"io_threads": 100000}, "io_threads must be an integer in [1, 256]"),
        ({"cpu_pool_path": "."}, "cpu_pool_path must be an absolute directory path"),
        ({"cpu_pool_path": ".."}, "cpu_pool_path must be an absolute directory path"),
        ({"cpu_pool_path": " "}, "cpu_pool_path must be an absolute directory path"),
        ({"l2_pool_path": "kv", "l2_bytes_to_use": 1}, "l2_pool_path must be an absolute"),
        ({"pool_name": "a/b"}, "pool_name must be 1-64 characters"),
        ({"pool_name": "a b"}, "pool_name must be 1-64 characters"),
        ({"pool_name": "x" * 65}, "pool_name must be 1-64 characters"),
        ({"l2_fsync": "sometimes"}, "l2_fsync must be one of ['batch', 'always', 'never']"),
        ({"direct_io": "yes"}, "direct_io must be one of ['auto', 'on', 'off']"),
        ({"verify_on_open": "false"}, "verify_on_open must be true or false"),
    ],
)
def test_edge_values_are_rejected_naming_the_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        OffloadConfig.from_extra_config(extra)
    assert message in str(excinfo.value)


def test_storage_keys_reach_the_store() -> None:
    config = OffloadConfig.from_extra_config(
        {
            "l2_pool_path": "/l2",
            "l2_bytes_to_use": "1GiB",
            "l2_fsync": "always",
            "direct_io": "off",
            "io_threads": 8,
            "verify_on_open": True,
        }
    )
    assert (config.l2_fsync, config.direct_io, config.io_threads, config.verify_on_open) == (
        "always",
        "off",
        8,
        True,
    )


def test_kvpool_errors_use_the_users_keys(tmp_path: Path) -> None:
    import kvpool_mmap
    from vllm_marconi_offload.config import USER_KEYS

    base = {"stride": 1 << 20, "engine_id": "e", "fingerprint": b"f"}
    with pytest.raises(kvpool_mmap.ConfigError) as excinfo:
        kvpool_mmap.StoreConfig.from_dict(
            {**base, "l1.path": "/dev/shm/x", "l1.bytes_to_use": 4096}, names=USER_KEYS
        )
    assert "cpu_bytes_to_use=4096 holds no slot" in str(excinfo.value)
    assert "l1." not in str(excinfo.value)
    config = kvpool_mmap.StoreConfig.from_dict(
        {**base, "l1.path": str(tmp_path), "l1.bytes_to_use": 1 << 20}, names=USER_KEYS
    )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD_L1,
            json.dumps(
                {**base, "fingerprint": "f", "l1.path": str(tmp_path), "l1.bytes_to_use": 1 << 20}
            ),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"ready\n"
        with pytest.raises(kvpool_mmap.PoolInUseError) as busy:
            kvpool_mmap.open_l1_rank(config, 0)
    finally:
        holder.kill()
        holder.wait()
    assert busy.value.errno == 16
    assert "its own pool_name (now 'e') or its own cpu_pool_path" in str(busy.value)


HOLD_L1 = """
import json, sys, time
from kvpool_mmap import StoreConfig, open_l1_rank
l1 = open_l1_rank(StoreConfig.from_dict(json.loads(sys.argv[1])), 0)
print("ready", flush=True)
time.sleep(60)
"""


def test_auto_options_are_settable() -> None:
    config = OffloadConfig.from_extra_config({"eviction_options": {"sample_entries": 512}})
    assert (config.eviction_policy, config.eviction_options) == ("auto", {"sample_entries": 512})


def test_a_newly_registered_policy_needs_no_plugin_edit() -> None:
    register_policy("test-plugin-lru", LRUPolicy)
    config = OffloadConfig.from_extra_config({"eviction_policy": "test-plugin-lru"})
    assert config.eviction_policy == "test-plugin-lru"


GPU_VARIABLES = (
    "VLLM_MARCONI_OFFLOAD_COPY",
    "VLLM_MARCONI_OFFLOAD_STAGING_MIB",
    "VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM",
)


def test_gpu_data_path_settings_are_keys_also_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in GPU_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    config = OffloadConfig.from_extra_config({})
    assert (config.copy_path, config.staging_bytes, config.pcie_programs_per_sm) == (
        "async",
        None,
        1,
    )
    config = OffloadConfig.from_extra_config(
        {"copy_path": "direct", "staging_bytes": "1GiB", "pcie_programs_per_sm": 2}
    )
    assert (config.copy_path, config.staging_bytes, config.pcie_programs_per_sm) == (
        "direct",
        1 << 30,
        2,
    )
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_COPY", "generic")
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_STAGING_MIB", "512")
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", "4")
    config = OffloadConfig.from_extra_config({})
    assert (config.copy_path, config.staging_bytes, config.pcie_programs_per_sm) == (
        "generic",
        512 << 20,
        4,
    )
    # A key given in the configuration wins over its variable.
    assert OffloadConfig.from_extra_config({"copy_path": "async"}).copy_path == "async"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("VLLM_MARCONI_OFFLOAD_COPY", "fast", "copy_path must be one of ['async', 'direct', "),
        ("VLLM_MARCONI_OFFLOAD_STAGING_MIB", "0", "staging_bytes must be a byte count >= 1"),
        ("VLLM_MARCONI_OFFLOAD_STAGING_MIB", "-1", "staging_bytes must be a byte count >= 1"),
        ("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", "two", "pcie_programs_per_sm must be an "),
        ("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", "0", "pcie_programs_per_sm must be an "),
    ],
)
def test_a_bad_gpu_variable_names_the_variable_and_the_key(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    for other in GPU_VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as error:
        OffloadConfig.from_extra_config({})
    assert str(error.value).startswith(f"{variable}={value!r}: {message}"), str(error.value)


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_config_file_gives_the_same_keys_and_inline_keys_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    path = write(
        tmp_path / "offload.yaml",
        "cpu_bytes_to_use: 2GiB\neviction_policy: lru\nadmission_threshold: 3\n",
    )
    config = OffloadConfig.from_extra_config({"config_file": path, "admission_threshold": 2})
    assert config.cpu_bytes_to_use == 2 << 30
    assert config.eviction_policy == "lru"
    assert config.admission_threshold == 2  # inline wins


def test_the_environment_names_the_file_when_config_file_is_not_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_FILE_ENV, write(tmp_path / "env.yaml", "load_mode: async\n"))
    assert OffloadConfig.from_extra_config({}).load_mode == "async"
    other = write(tmp_path / "other.yaml", "load_mode: same_step\n")
    assert OffloadConfig.from_extra_config({"config_file": other}).load_mode == "same_step"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "cpu_bytes: 1GiB\n",
            "{path}: unknown key(s) ['cpu_bytes'] (did you mean 'cpu_bytes_to_use'?); accepted "
            "keys: [",
        ),
        (
            "cpu_bytes_to_use: lots\n",
            "{path}: cpu_bytes_to_use must be a byte count in [1, 2^60] such as 8GiB",
        ),
        (
            "load_mode: sync\n",
            "{path}: load_mode must be one of ['auto', 'async', 'same_step', 'layer",
        ),
        ("eviction_policy: fifo\n", "{path}: eviction_policy: eviction policy 'fifo' is unk"),
        ("l2_pool_path: /l2\n", "{path}: l2_pool_path is set: l2_bytes_to_use must be"),
        ("config_file: other.yaml\n", "{path}: config_file cannot name another file"),
        ("- cpu_bytes_to_use\n", "{path}: must hold a mapping of settings (key: value), got list"),
        ("load_mode: [async\n", "{path}: not valid YAML: "),
    ],
)
def test_a_bad_file_names_the_file_and_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    path = write(tmp_path / "offload.yaml", text)
    for extra, env in (({"config_file": path}, None), ({}, path)):
        if env is not None:
            monkeypatch.setenv(CONFIG_FILE_ENV, env)
        with pytest.raises(ConfigError) as excinfo:
            OffloadConfig.from_extra_config(extra)
        assert message.format(path=path) in str(excinfo.value)
        assert "\n" not in str(excinfo.value)


def test_an_inline_error_does_not_blame_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    path = write(tmp_path / "offload.yaml", "load_mode: async\n")
    with pytest.raises(ConfigError) as excinfo:
        OffloadConfig.from_extra_config({"config_file": path, "load_mode": "sync"})
    assert str(excinfo.value).startswith("load_mode must be one of")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.yaml")
    with pytest.raises(ConfigError, match=rf"config_file {missing}: cannot read it: No such"):
        OffloadConfig.from_extra_config({"config_file": missing})
