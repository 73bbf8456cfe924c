"""MemKV key names for both modes. No vLLM import: the FileMapper is passed in.

Tier mode: vLLM's FileMapper path of the chunk with the weights fingerprint folded into
the run folder, ``<prefix>/<model>_<configdigest>_w<fingerprint>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin``.
Names longer than :data:`MAX_NAME` become ``memkv-vt:<blake2b-256 hex>``.

Direct mode: binary ``b"mkvd1" + digest(12) + rank(2, big endian) + OffloadKey``, where the
digest covers model, weights fingerprint, dtype, TP size, block size, KV layout and the
user prefix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "DIRECT_MAGIC",
    "MAX_NAME",
    "TierNamer",
    "direct_key",
    "direct_prefix",
    "publish_key",
]

MAX_NAME = 480  # the wire limit is 512 bytes; leave room like the vendor plugins do
DIRECT_MAGIC = b"mkvd1"


class FileMapperLike(Protocol):
    base_path: str

    def get_file_name(self, key: bytes) -> str: ...


def _short(name: str) -> bytes:
    data = name.encode()
    if len(data) <= MAX_NAME:
        return data
    return b"memkv-vt:" + hashlib.blake2b(data, digest_size=32).hexdigest().encode()


class TierNamer:
    """Maps OffloadKeys (block hash + group) to tier value names."""

    def __init__(self, mapper: FileMapperLike, fingerprint: str) -> None:
        self._mapper = mapper
        self._base = mapper.base_path
        self.run_folder = f"{self._base}_w{fingerprint}"

    def name(self, key: bytes) -> bytes:
        path = self._mapper.get_file_name(key)
        assert path.startswith(self._base), (path, self._base)
        return _short(self.run_folder + path[len(self._base) :])

    def config_record_name(self) -> bytes:
        """Where the run's FileMapper fields are recorded (for operators)."""
        return _short(self.run_folder + "/config.json")


def direct_prefix(ident: Mapping[str, Any], fingerprint: str, user_prefix: str) -> bytes:
    """The key prefix of one model/layout; identical on every rank of a run."""
    blob = json.dumps(
        {"ident": dict(ident), "weights": fingerprint, "prefix": user_prefix},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return DIRECT_MAGIC + hashlib.blake2b(blob, digest_size=12).digest()


def direct_key(prefix: bytes, rank: int, offload_key: bytes) -> bytes:
    """The value name of one block on one TP rank."""
    return prefix + rank.to_bytes(2, "big") + offload_key


def publish_key(engine_id: str, rank: int) -> bytes:
    """Where worker ``rank`` of engine ``engine_id`` publishes its key prefix."""
    return f"memkv-vllm/publish/{engine_id}/r{rank}".encode()
