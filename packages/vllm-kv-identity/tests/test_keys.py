"""Store keys, and whether block hashes change across restarts."""

from __future__ import annotations

import pytest
from vllm_kv_identity import block_key, chain_keys, key_group, restart_hash_problem


def test_keys_carry_hash_and_group() -> None:
    assert block_key(b"\x01" * 32, 3) == b"\x01" * 32 + b"\x00\x00\x00\x03"
    assert block_key(b"h", 0) != block_key(b"h", 1)
    assert chain_keys([b"a", b"b"], 2) == [block_key(b"a", 2), block_key(b"b", 2)]
    assert key_group(block_key(b"\x01" * 32, 70000)) == 70000


@pytest.mark.parametrize(
    ("version", "algo", "seed", "problem"),
    [
        ("0.27.1", "sha256", None, True),  # random NONE_HASH before 0.29
        ("0.28.0", "sha256", "0", False),
        ("0.29.0", "sha256", None, False),  # fixed seed for sha256 from 0.29
        ("0.32.0", "sha256_cbor", None, False),
        ("0.32.0", "xxhash", None, True),  # xxhash stays random without PYTHONHASHSEED
        ("0.32.0", "xxhash_cbor", "random", True),
        ("0.32.0", "xxhash", "42", False),
        ("0.33.0.dev1+cpu", "sha256", None, False),
    ],
)
def test_restart_hash_problem(version: str, algo: str, seed: str | None, problem: bool) -> None:
    assert (restart_hash_problem(version, algo, seed) is not None) is problem
