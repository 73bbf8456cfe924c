"""Store keys for vLLM blocks, and whether those keys survive a process restart."""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import Version

GROUP_ID_BYTES = 4


def block_key(block_hash: bytes, group_id: int) -> bytes:
    """The store key of one block of one KV-cache group: the block hash plus the group."""
    return bytes(block_hash) + group_id.to_bytes(GROUP_ID_BYTES, "big")


def chain_keys(block_hashes: Sequence[bytes], group_id: int) -> list[bytes]:
    """Keys of a request's prefix blocks, in chain order."""
    return [block_key(h, group_id) for h in block_hashes]


def restart_hash_problem(
    vllm_version: str, hash_algorithm: str, pythonhashseed: str | None
) -> str | None:
    """Why block hashes will differ in the next process, or None when they will not.

    vLLM seeds the hash chain with NONE_HASH. Before 0.29 it is random per process unless
    PYTHONHASHSEED is set; from 0.29 it is fixed for sha256/sha256_cbor and still random
    for xxhash/xxhash_cbor without PYTHONHASHSEED.
    """
    if pythonhashseed not in (None, "", "random"):
        return None
    if Version(vllm_version).release < (0, 29):
        return (
            f"vLLM {vllm_version} seeds block hashes randomly per process unless "
            "PYTHONHASHSEED is set"
        )
    if hash_algorithm.startswith("xxhash"):
        return (
            f"prefix_caching_hash_algo={hash_algorithm} seeds block hashes randomly per "
            "process unless PYTHONHASHSEED is set"
        )
    return None
