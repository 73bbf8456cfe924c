"""MemKV key names for both modes. No vLLM import: the FileMapper is passed in.

Tier mode: vLLM's FileMapper path of the chunk with the weights fingerprint folded into
the run folder, `<prefix>/<model>_<configdigest>_w<fingerprint>_r<rank>/<hhh>/<hh>_g<g>/<hash>.bin`.
Names longer than `MAX_NAME` become `memkv-vt:<blake2b-256 hex>`.

Direct mode: binary `b"mkvd1" + digest(12) + rank(2, big endian) + OffloadKey`, where the
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
    "prefix_differences",
    "prefix_record",
    "publish_key",
    "split_prefix_record",
]

MAX_NAME = 480  # the wire limit is 512 bytes; leave room like the vendor plugins do
DIRECT_MAGIC = b"mkvd1"
PREFIX_BYTES = len(DIRECT_MAGIC) + 12


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


def _prefix_source(ident: Mapping[str, Any], fingerprint: str, user_prefix: str) -> bytes:
    return json.dumps(
        {"ident": dict(ident), "weights": fingerprint, "prefix": user_prefix},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def direct_prefix(ident: Mapping[str, Any], fingerprint: str, user_prefix: str) -> bytes:
    """The key prefix of one model/layout; identical on every rank of a run."""
    blob = _prefix_source(ident, fingerprint, user_prefix)
    return DIRECT_MAGIC + hashlib.blake2b(blob, digest_size=12).digest()


def prefix_record(ident: Mapping[str, Any], fingerprint: str, user_prefix: str) -> bytes:
    """What a worker publishes: its key prefix, then the JSON the prefix was derived from
    (so a scheduler that finds ranks disagreeing can say in what)."""
    source = _prefix_source(ident, fingerprint, user_prefix)
    return direct_prefix(ident, fingerprint, user_prefix) + source


def split_prefix_record(record: bytes) -> tuple[bytes, dict[str, Any]]:
    """The key prefix of a published record and the fields it came from ({} if absent)."""
    head, source = record[:PREFIX_BYTES], record[PREFIX_BYTES:]
    return head, (json.loads(source) if source else {})


def prefix_differences(records: Mapping[int, bytes]) -> str:
    """Each rank whose published prefix differs from rank 0's, and the fields that differ."""
    reference, reference_fields = split_prefix_record(records[0])
    expected = _flat(reference_fields)
    found = []
    for rank, record in sorted(records.items()):
        prefix, fields = split_prefix_record(record)
        if prefix == reference:
            continue
        seen = _flat(fields)
        keys = sorted(k for k in expected.keys() | seen.keys() if expected.get(k) != seen.get(k))
        how = ", ".join(f"{k}={seen.get(k)!r} where rank 0 has {expected.get(k)!r}" for k in keys)
        found.append(f"rank {rank}: {how or f'prefix {prefix.hex()} vs {reference.hex()}'}")
    return "; ".join(found)


def _flat(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {**fields.get("ident", {}), **{k: v for k, v in fields.items() if k != "ident"}}


def direct_key(prefix: bytes, rank: int, offload_key: bytes) -> bytes:
    """The value name of one block on one TP rank."""
    return prefix + rank.to_bytes(2, "big") + offload_key


def publish_key(engine_id: str, rank: int) -> bytes:
    """Where worker `rank` of engine `engine_id` publishes its key prefix."""
    return f"memkv-vllm/publish/{engine_id}/r{rank}".encode()
