"""Store keys of vLLM blocks: the block hash followed by the KV-cache group id.

The same packing as vLLM's `OffloadKey`, so a key read back names its group.
"""

from __future__ import annotations

from collections.abc import Sequence

GROUP_ID_BYTES = 4


def block_key(block_hash: bytes, group_id: int) -> bytes:
    """The store key of one block of one KV-cache group: the block hash plus the group."""
    return bytes(block_hash) + group_id.to_bytes(GROUP_ID_BYTES, "big")


def chain_keys(block_hashes: Sequence[bytes], group_id: int) -> list[bytes]:
    """Keys of a request's prefix blocks, in chain order."""
    return [block_key(h, group_id) for h in block_hashes]


def key_group(key: bytes) -> int:
    """The KV-cache group a key (from `block_key`, or a vLLM `OffloadKey`) belongs to."""
    return int.from_bytes(key[-GROUP_ID_BYTES:], "big")
