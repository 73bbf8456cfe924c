"""On-disk formats: the file superblock and the per-slot header, with their checksums.

Every file starts with a one-page superblock; L2 files then hold a table of fixed-size slot
headers and the page-aligned payloads. All integers are little-endian.

Slot header (HEADER_BYTES = 256)::

    magic "KVSH" | version u16 | key_len u16 | length u32 | depth u32
    generation u64 | payload xxh3_64 u64 | key (MAX_KEY_BYTES, zero padded)
    header xxh3_64 u64 (over everything before it) | zero padding

A header whose magic is zero is EMPTY; one whose own checksum fails is CORRUPT (a torn
header write). Neither is ever indexed.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import xxhash

from ._config import HEADER_BYTES, MAX_KEY_BYTES, PAGE, StoreConfig
from ._errors import LayoutMismatchError

FORMAT_VERSION = 1

SLOT_MAGIC = b"KVSH"
_SLOT = struct.Struct(f"<4sHHIIQQ{MAX_KEY_BYTES}s")
_SLOT_CHECKED = _SLOT.size  # header checksum covers these bytes
_HCHECK = struct.Struct("<Q")
assert _SLOT_CHECKED + _HCHECK.size <= HEADER_BYTES

L1_MAGIC = b"KVPOOLL1"
L2_MAGIC = b"KVPOOLL2"
_SUPER = struct.Struct("<8sHHIIIIQQQQQ16s64s")
assert _SUPER.size + _HCHECK.size <= PAGE


def payload_checksum(data: object) -> int:
    """xxh3_64 of a payload (any buffer: bytes, memoryview, contiguous numpy array)."""
    return xxhash.xxh3_64_intdigest(data)  # type: ignore[arg-type]


def fingerprint_digest(fingerprint: bytes) -> bytes:
    """16-byte digest of the caller's layout fingerprint, stored in every superblock."""
    return xxhash.xxh3_128_digest(bytes(fingerprint))


class SlotHeader(NamedTuple):
    """A decoded, self-consistent slot header."""

    key: bytes
    generation: int
    length: int
    checksum: int
    depth: int = 0


class HeaderState(enum.Enum):
    """What decode_header found in a header-table entry."""

    VALID = "valid"
    EMPTY = "empty"
    CORRUPT = "corrupt"


def encode_header(key: bytes, generation: int, length: int, checksum: int, depth: int = 0) -> bytes:
    """HEADER_BYTES bytes describing `key`'s payload."""
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key is {len(key)} bytes; at most {MAX_KEY_BYTES} are supported")
    body = _SLOT.pack(
        SLOT_MAGIC, FORMAT_VERSION, len(key), length, depth & 0xFFFFFFFF, generation, checksum, key
    )
    raw = body + _HCHECK.pack(xxhash.xxh3_64_intdigest(body))
    return raw + bytes(HEADER_BYTES - len(raw))


EMPTY_HEADER = bytes(HEADER_BYTES)


def decode_header(raw: bytes | memoryview) -> tuple[HeaderState, SlotHeader | None]:
    """Decode one header-table entry; only VALID comes with a SlotHeader."""
    body = bytes(raw[:_SLOT_CHECKED])
    magic, version, key_len, length, depth, gen, checksum, key = _SLOT.unpack(body)
    if magic != SLOT_MAGIC:
        return (HeaderState.EMPTY if magic == b"\0\0\0\0" else HeaderState.CORRUPT), None
    (stored,) = _HCHECK.unpack(bytes(raw[_SLOT_CHECKED : _SLOT_CHECKED + _HCHECK.size]))
    if stored != xxhash.xxh3_64_intdigest(body) or version != FORMAT_VERSION:
        return HeaderState.CORRUPT, None
    if key_len > MAX_KEY_BYTES:
        return HeaderState.CORRUPT, None
    return HeaderState.VALID, SlotHeader(key[:key_len], gen, length, checksum, depth)


_TABLE_DTYPE = np.dtype(
    {
        "names": ["magic", "version", "key_len", "length", "depth", "gen", "checksum", "hcheck"],
        "formats": ["<u4", "<u2", "<u2", "<u4", "<u4", "<u8", "<u8", "<u8"],
        "offsets": [0, 4, 6, 8, 12, 16, 24, _SLOT_CHECKED],
        "itemsize": HEADER_BYTES,
    }
)
_MAGIC_U32 = int.from_bytes(SLOT_MAGIC, "little")
_KEY_OFFSET = 32


def decode_table(table: np.ndarray) -> tuple[dict[int, SlotHeader], list[int]]:
    """Decode a whole header table (uint8 [n, HEADER_BYTES]) at once.

    Returns the VALID headers by slot and the slots that are CORRUPT (same verdicts as
    decode_header, several times faster: fields are read with numpy, only the header
    checksums are computed per live row).
    """
    flat = np.ascontiguousarray(table).reshape(-1)
    rows = flat.view(_TABLE_DTYPE)
    live = np.flatnonzero(rows["magic"] != 0)
    sel = rows[live]
    raw = memoryview(flat.data)
    valid: dict[int, SlotHeader] = {}
    corrupt: list[int] = []
    digest = xxhash.xxh3_64_intdigest
    columns = zip(
        live.tolist(),
        sel["magic"].tolist(),
        sel["version"].tolist(),
        sel["key_len"].tolist(),
        sel["length"].tolist(),
        sel["depth"].tolist(),
        sel["gen"].tolist(),
        sel["checksum"].tolist(),
        sel["hcheck"].tolist(),
        strict=True,
    )
    for slot, magic, version, key_len, length, depth, gen, checksum, hcheck in columns:
        base = slot * HEADER_BYTES
        if (
            magic != _MAGIC_U32
            or version != FORMAT_VERSION
            or key_len > MAX_KEY_BYTES
            or digest(raw[base : base + _SLOT_CHECKED]) != hcheck
        ):
            corrupt.append(slot)
            continue
        key = bytes(raw[base + _KEY_OFFSET : base + _KEY_OFFSET + key_len])
        valid[slot] = SlotHeader(key, gen, length, checksum, depth)
    return valid, corrupt


def live_header_indices(table: np.ndarray) -> np.ndarray:
    """Indices of header-table rows (uint8 [n, HEADER_BYTES]) whose magic is not zero."""
    magics = table[:, :4].copy().view("<u4").reshape(-1)
    return np.flatnonzero(magics != 0)


@dataclass(frozen=True)
class Superblock:
    """Page 0 of every pool file: what the file is, for whom, and its geometry."""

    magic: bytes
    tp_rank: int
    dp_rank: int
    tp_size: int
    dp_size: int
    stride: int
    num_slots: int
    payload_bytes: int
    header_offset: int
    data_offset: int
    fingerprint: bytes
    engine_id: str

    def encode(self) -> bytes:
        """One page."""
        body = _SUPER.pack(
            self.magic,
            FORMAT_VERSION,
            0,
            self.tp_rank,
            self.dp_rank,
            self.tp_size,
            self.dp_size,
            self.stride,
            self.num_slots,
            self.payload_bytes,
            self.header_offset,
            self.data_offset,
            self.fingerprint,
            self.engine_id.encode(),
        )
        raw = body + _HCHECK.pack(xxhash.xxh3_64_intdigest(body))
        return raw + bytes(PAGE - len(raw))

    @classmethod
    def decode(cls, raw: bytes, expected_magic: bytes) -> Superblock:
        """Parse page 0; LayoutMismatchError with a distinct message per failure."""
        if len(raw) < _SUPER.size + _HCHECK.size:
            raise LayoutMismatchError("file is shorter than a superblock")
        body = raw[: _SUPER.size]
        fields = _SUPER.unpack(body)
        if fields[0] != expected_magic:
            raise LayoutMismatchError(f"bad magic {fields[0]!r}, expected {expected_magic!r}")
        if fields[1] != FORMAT_VERSION:
            raise LayoutMismatchError(
                f"format version {fields[1]}, this kvpool-mmap reads version {FORMAT_VERSION}"
            )
        (stored,) = _HCHECK.unpack(raw[_SUPER.size : _SUPER.size + _HCHECK.size])
        if stored != xxhash.xxh3_64_intdigest(body):
            raise LayoutMismatchError("superblock checksum mismatch (torn or corrupted)")
        return cls(
            magic=fields[0],
            tp_rank=fields[3],
            dp_rank=fields[4],
            tp_size=fields[5],
            dp_size=fields[6],
            stride=fields[7],
            num_slots=fields[8],
            payload_bytes=fields[9],
            header_offset=fields[10],
            data_offset=fields[11],
            fingerprint=fields[12],
            engine_id=fields[13].rstrip(b"\0").decode(),
        )


def expected_superblock(
    config: StoreConfig, tp_rank: int, magic: bytes, num_slots: int, payload: int
) -> Superblock:
    """The superblock a file of this config, rank and tier must carry."""
    header_offset = PAGE
    if magic == L2_MAGIC:
        data_offset = PAGE + -(-num_slots * HEADER_BYTES // PAGE) * PAGE
    else:
        header_offset = 0
        data_offset = PAGE
    return Superblock(
        magic=magic,
        tp_rank=tp_rank,
        dp_rank=config.dp_rank,
        tp_size=config.tp_size,
        dp_size=config.dp_size,
        stride=config.stride,
        num_slots=num_slots,
        payload_bytes=payload,
        header_offset=header_offset,
        data_offset=data_offset,
        fingerprint=fingerprint_digest(config.fingerprint),
        engine_id=config.engine_id,
    )


def describe_mismatch(found: Superblock, want: Superblock) -> str:
    """Human-readable list of the fields that differ."""
    diffs = [
        f"{name}: file has {getattr(found, name)!r}, config wants {getattr(want, name)!r}"
        for name in (
            "engine_id",
            "tp_rank",
            "dp_rank",
            "tp_size",
            "dp_size",
            "stride",
            "num_slots",
            "payload_bytes",
            "fingerprint",
        )
        if getattr(found, name) != getattr(want, name)
    ]
    return "; ".join(diffs)
