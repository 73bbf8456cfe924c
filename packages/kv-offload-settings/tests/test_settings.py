"""A declaration gives the check, the normalised value, the error and the README row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from kv_offload_settings import (
    ConfigError,
    check_keys,
    checked_fields,
    markdown_table,
    read_config_file,
    setting,
    settings_of,
)


@dataclass(frozen=True)
class Pool:
    size: int = setting("bytes", "Bytes of the pool.", 1 << 30, maximum=1 << 60)
    threads: int = setting("int", "Worker threads.", 4, maximum=64, env="POOL_THREADS")
    mode: str = setting("choice", "How writes reach disk.", "batch", choices=("batch", "always"))

    def __post_init__(self) -> None:
        checked_fields(self, lambda name: f"pool.{name}")


class PoolError(ConfigError):
    pass


def test_values_are_normalised() -> None:
    assert Pool(size="8gib").size == 8 << 30  # type: ignore[arg-type]


def test_an_error_names_the_key_the_value_and_the_accepted_form() -> None:
    with pytest.raises(ConfigError) as excinfo:
        Pool(threads=0)
    assert str(excinfo.value) == "pool.threads must be an integer in [1, 64], got 0"


def test_a_misspelt_choice_gets_the_nearest_one() -> None:
    with pytest.raises(ConfigError, match=r"got 'bacth' \(did you mean 'batch'\?\)$"):
        Pool(mode="bacth")


def test_a_package_raises_its_own_subclass() -> None:
    with pytest.raises(PoolError, match="size must be a byte count"):
        settings_of(Pool)["size"].check("lots", error=PoolError)


def test_a_misspelt_key_gets_the_nearest_one_and_every_accepted_key() -> None:
    with pytest.raises(ConfigError) as excinfo:
        check_keys({"thread": 2, "mode": "batch"}, settings_of(Pool), "pool.yaml")
    assert str(excinfo.value) == (
        "pool.yaml: unknown key(s) ['thread'] (did you mean 'threads'?); "
        "accepted keys: ['mode', 'size', 'threads']"
    )


def test_the_readme_table_has_an_environment_column_when_a_setting_has_a_variable() -> None:
    assert markdown_table(settings_of(Pool), header="Key").splitlines() == [
        "| Key | Environment | Accepted | Default | Meaning |",
        "| --- | --- | --- | --- | --- |",
        "| `size` |  | a byte count in [1, 2^60] such as 8GiB, 8GB, 8G or 8589934592 (all "
        "binary: 1 GB = 2^30 bytes) | `1GiB` | Bytes of the pool. |",
        "| `threads` | `POOL_THREADS` | an integer in [1, 64] | `4` | Worker threads. |",
        "| `mode` |  | one of ['batch', 'always'] | `batch` | How writes reach disk. |",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [1\n", "{path}: not valid YAML: "),
        ("- a\n", "{path}: must hold a mapping of settings (key: value), got list"),
    ],
)
def test_a_bad_config_file_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as excinfo:
        read_config_file(path)
    assert str(excinfo.value).startswith(message.format(path=path))


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{tmp_path}/none.yaml: cannot read it: No such"):
        read_config_file(tmp_path / "none.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert read_config_file(tmp_path / "empty.yaml") == {}


@dataclass(frozen=True)
class Client:
    timeout_ms: int = setting("int", "Deadline.", 5000, maximum=86_400_000)
    key: str | None = setting("any", "Secret.", None, accepts="hex", optional=True, secret=True)
    servers: tuple[str, ...] = setting("any", "Servers.", ("a:1", "b:2"), accepts="host:port")
    read_rate: float = setting("number", "Bytes/s.", 1.5e9, maximum=1e12)


def test_large_integer_bounds_and_tuple_defaults_read_as_written() -> None:
    rows = markdown_table(settings_of(Client)).splitlines()
    assert "| `timeout_ms` | an integer in [1, 86400000] | `5000` | Deadline. |" in rows
    assert "| `servers` | host:port | `a:1,b:2` | Servers. |" in rows
    assert (
        "| `read_rate` | a finite number in [1.0, 1000000000000] | `1500000000` | Bytes/s. |"
        in rows
    )


def test_a_secret_is_never_shown() -> None:
    assert "abc" not in repr(Client(key="abc"))
    declared = settings_of(Client)["key"]
    assert declared.got("abc") == ""
    assert settings_of(Client)["timeout_ms"].got(0) == ", got 0"
