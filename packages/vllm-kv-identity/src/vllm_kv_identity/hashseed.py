"""Whether vLLM's block hashes survive a process restart (and so match across instances)."""

from __future__ import annotations

from packaging.version import Version


def restart_hash_problem(
    vllm_version: str, hash_algorithm: str | None, pythonhashseed: str | None
) -> str | None:
    """Why block hashes will differ in the next process, or None when they will not.

    vLLM seeds the hash chain with NONE_HASH. Before 0.29 it is random per process unless
    PYTHONHASHSEED is set; from 0.29 it is fixed for sha256/sha256_cbor and still random
    for xxhash/xxhash_cbor without PYTHONHASHSEED. `hash_algorithm` is
    `cache_config.prefix_caching_hash_algo` (None: the default, sha256).
    """
    if pythonhashseed not in (None, "", "random"):
        return None
    if Version(vllm_version).release < (0, 29):
        return f"vLLM {vllm_version} seeds block hashes per process (randomly)"
    if hash_algorithm is not None and hash_algorithm.startswith("xxhash"):
        return f"prefix_caching_hash_algo={hash_algorithm} seeds block hashes per process"
    return None
