"""One size rule in every package and CLI: each spelling means the same bytes, or gets the
same error, wherever a size is given (kvpool-mmap, the connector inline and in its config
file, memkv-client and the real `memkv serve`). The `kvpool` CLI takes no size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kvpool_mmap import ConfigError as StoreConfigError
from kvpool_mmap import StoreConfig, parse_size
from memkv_client.server import parse_size as memkv_parse_size
from vllm_marconi_offload import ConfigError, OffloadConfig

pytestmark = pytest.mark.newest  # no vLLM involved: one run is enough

EXAMPLES = "such as 8GiB, 8GB, 8G or 8589934592 (all binary: 1 GB = 2^30 bytes)"
SPELLINGS: list[tuple[str, int | None]] = [
    ("1MiB", 1 << 20),
    ("1MB", 1 << 20),
    ("1M", 1 << 20),
    ("1mb", 1 << 20),
    ("1MIB", 1 << 20),  # units are case-blind
    ("1mib", 1 << 20),
    ("1 MiB", 1 << 20),
    ("1048576", 1 << 20),
    ("1.5MiB", 3 << 19),
    ("2048KiB", 2 << 20),
    ("lots", None),
    ("-1MiB", None),
    ("1Mx", None),
    ("8b", None),  # bitmath reads a lone "b" as bits
    ("8.7", None),  # not a whole number of bytes
    ("", None),
]


def kvpool_store(text: str) -> int:
    base = {"stride": 4096, "engine_id": "e", "fingerprint": b"f", "l1.path": "/dev/shm"}
    return StoreConfig.from_dict({**base, "l1.bytes_to_use": text}).l1.bytes_to_use


def connector_inline(text: str) -> int:
    return OffloadConfig.from_extra_config({"cpu_bytes_to_use": text}).cpu_bytes_to_use


def connector_file(text: str, folder: Path) -> int:
    path = folder / "offload.yaml"
    path.write_text(f'cpu_bytes_to_use: "{text}"\n')
    return OffloadConfig.from_extra_config({"config_file": str(path)}).cpu_bytes_to_use


def memkv_serve(text: str) -> int:
    """The real `memkv serve --memory TEXT`: the memory it reports, or ValueError with
    its one-line error (exit status 2)."""
    env = {**os.environ, "MEMKV_AUTH_KEY": "ab" * 32}
    cmd = [sys.executable, "-m", "memkv_client.server", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*cmd, "--no-prefault", f"--memory={text}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            assert proc.wait(30) == 2
            assert proc.stderr is not None
            raise ValueError(proc.stderr.read().strip())
        found = re.search(r" memory=(\d+) ", line)
        assert found, line
        return int(found[1])
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("text", "size"), SPELLINGS)
def test_each_spelling_means_the_same_everywhere(
    tmp_path: Path, text: str, size: int | None
) -> None:
    entry_points: dict[str, Callable[[str], int]] = {
        "kvpool_mmap.parse_size": parse_size,
        "kvpool_mmap.StoreConfig l1.bytes_to_use": kvpool_store,
        "connector cpu_bytes_to_use": connector_inline,
        "connector config_file": lambda t: connector_file(t, tmp_path),
        "memkv_client.server.parse_size": memkv_parse_size,
        "memkv serve --memory": memkv_serve,
    }
    for where, parse in entry_points.items():
        if size is not None:
            assert parse(text) == size, where
            continue
        with pytest.raises((ValueError, StoreConfigError, ConfigError)) as excinfo:
            parse(text)
        message = str(excinfo.value)
        assert EXAMPLES in message, where
        assert repr(text) in message, where
        assert "\n" not in message, where
