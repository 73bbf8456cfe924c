"""Bad configuration fails early with an error naming the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import MakeConfig
from kvpool_mmap import ConfigError, StoreConfig, TierConfig, TieredStore


@pytest.mark.parametrize(
    ("override", "setting"),
    [
        ({"stride": 0}, "stride"),
        ({"stride": -4096}, "stride"),
        ({"stride": 1.5}, "stride"),
        ({"engine_id": ""}, "engine_id"),
        ({"engine_id": "a/b"}, "engine_id"),
        ({"fingerprint": "text"}, "fingerprint"),
        ({"dp_size": 0}, "dp_size"),
        ({"tp_size": -1}, "tp_size"),
        ({"dp_size": 2, "dp_rank": 2}, "dp_rank"),
        ({"dp_rank": -1}, "dp_rank"),
        ({"admission_threshold": 0}, "admission_threshold"),
        ({"io_threads": 0}, "io_threads"),
        ({"l2_fsync": "sometimes"}, "l2_fsync"),
        ({"direct_io": "yes"}, "direct_io"),
        ({"fsync_interval_s": 0}, "fsync_interval_s"),
        ({"max_inflight_io": 0}, "max_inflight_io"),
    ],
)
def test_bad_setting_names_it(
    make_config: MakeConfig, override: dict[str, Any], setting: str
) -> None:
    with pytest.raises(ConfigError, match=setting):
        make_config(**override)


@pytest.mark.parametrize("size", [0, -1, 1 << 63, 10**30, 1e30, float("inf"), float("nan")])
def test_bad_tier_size(tmp_path: Path, make_config: MakeConfig, size: int) -> None:
    with pytest.raises(ConfigError, match=r"l1\.bytes_to_use"):
        make_config(l1=TierConfig(tmp_path, size))
    with pytest.raises(ConfigError, match=r"l2\.bytes_to_use"):
        make_config(l2=TierConfig(tmp_path, size))


@pytest.mark.parametrize("path", [".", "..", " ", "", "relative/dir", "l1"])
def test_relative_or_blank_tier_path(path: str, make_config: MakeConfig) -> None:
    # a relative path names another directory in each process ("." put L1 on disk)
    with pytest.raises(ConfigError, match=r"l1\.path must be an absolute directory path"):
        make_config(l1=TierConfig(path, 1 << 20))
    with pytest.raises(ConfigError, match=r"l2\.path must be an absolute directory path"):
        make_config(l2=TierConfig(path, 1 << 20))


@pytest.mark.parametrize(
    ("override", "setting"),
    [
        ({"fsync_interval_s": float("nan")}, "fsync_interval_s"),
        ({"fsync_interval_s": float("inf")}, "fsync_interval_s"),
        ({"io_threads": 10**9}, "io_threads"),
        ({"stride": 1 << 63}, "stride"),
        ({"verify_on_open": "false"}, "verify_on_open"),
        ({"write_through": 0}, "write_through"),
    ],
)
def test_out_of_range_values_name_the_setting(
    make_config: MakeConfig, override: dict[str, Any], setting: str
) -> None:
    with pytest.raises(ConfigError, match=setting):
        make_config(**override)


def test_budget_smaller_than_one_slot_after_split(make_config: MakeConfig) -> None:
    # 8 slots in total, split over dp 4 x tp 4 = 16 ranks: not one slot each
    with pytest.raises(ConfigError, match=r"l1\.bytes_to_use.*dp_size\*tp_size=16"):
        make_config(l1_slots=2, tp_size=4, dp_size=4)


def test_budget_split_over_dp_and_tp(make_config: MakeConfig) -> None:
    cfg = make_config(l1_slots=8, l2_slots=16, tp_size=2, dp_size=3, dp_rank=1)
    # the fixture sizes budgets for tp ranks only; dp splits them further
    assert cfg.l1_slots == 8 // 3
    assert cfg.l2_slots == 16 // 3
    assert "dp1-tp1" in cfg.l1_file(1).name
    assert cfg.l1_file(0) != cfg.l1_file(1)


def test_bad_policy_name(make_config: MakeConfig) -> None:
    with pytest.raises(
        ConfigError, match=r"eviction_policy.*'fifo-nonexistent'.*accepted values: auto, .*lru"
    ):
        make_config(eviction_policy="fifo-nonexistent")


def test_bad_policy_option_named_before_anything_opens(make_config: MakeConfig) -> None:
    with pytest.raises(ConfigError, match=r"eviction_options.*'smoothing'.*\[0, 1\)"):
        make_config(eviction_policy="auto", eviction_options={"smoothing": 2.0})


def test_default_policy_is_auto_with_settable_options(make_config: MakeConfig) -> None:
    assert make_config().eviction_policy == "auto"
    assert make_config(eviction_options={"sample_entries": 512}).eviction_options == {
        "sample_entries": 512
    }


def test_missing_path(tmp_path: Path, make_config: MakeConfig) -> None:
    cfg = make_config(l1=TierConfig(tmp_path / "no" / "such" / "dir", 1 << 20))
    with pytest.raises(ConfigError, match=r"l1\.path"):
        TieredStore(cfg)


def test_path_is_a_file(tmp_path: Path, make_config: MakeConfig) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"x")
    cfg = make_config(l2=TierConfig(f, 1 << 20))
    with pytest.raises(ConfigError, match=r"l2\.path.*not a directory"):
        TieredStore(cfg)


def test_unwritable_path(make_config: MakeConfig) -> None:
    # /proc/self exists and is a directory nobody, not even root, can create files in
    cfg = make_config(l1=TierConfig("/proc/self", 1 << 20))
    with pytest.raises(ConfigError, match=r"l1\.path.*not writable"):
        TieredStore(cfg)


def test_from_dict_rejects_unknown_keys(tmp_path: Path) -> None:
    base = {
        "stride": 4096,
        "engine_id": "e",
        "fingerprint": "fp",
        "l1": {"path": str(tmp_path), "bytes_to_use": 1 << 20},
    }
    cfg = StoreConfig.from_dict(base)
    assert cfg.fingerprint == b"fp"
    assert cfg.l1_slots == 256
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['cpu_bytes_to_use'\]"):
        StoreConfig.from_dict({**base, "cpu_bytes_to_use": 1})
    with pytest.raises(ConfigError, match=r"\['write_thru'\] \(did you mean 'write_through'\?\)"):
        StoreConfig.from_dict({**base, "write_thru": False})
    with pytest.raises(ConfigError, match=r"l1: unknown key\(s\) \['size'\]"):
        StoreConfig.from_dict({**base, "l1": {"path": "/x", "bytes_to_use": 1, "size": 2}})
    with pytest.raises(ConfigError, match="stride"):
        StoreConfig.from_dict({k: v for k, v in base.items() if k != "stride"})
