"""Slot header and superblock codecs: round trips, every corruption detected."""

from __future__ import annotations

import pytest
from conftest import MakeConfig
from hypothesis import given
from hypothesis import strategies as st
from kvpool_mmap import HEADER_BYTES, MAX_KEY_BYTES, LayoutMismatchError
from kvpool_mmap._codec import (
    L1_MAGIC,
    L2_MAGIC,
    HeaderState,
    Superblock,
    decode_header,
    encode_header,
    expected_superblock,
)


@given(
    key=st.binary(max_size=MAX_KEY_BYTES),
    gen=st.integers(0, 2**64 - 1),
    length=st.integers(0, 2**32 - 1),
    checksum=st.integers(0, 2**64 - 1),
    depth=st.integers(0, 2**32 - 1),
)
def test_header_round_trip(key: bytes, gen: int, length: int, checksum: int, depth: int) -> None:
    raw = encode_header(key, gen, length, checksum, depth)
    assert len(raw) == HEADER_BYTES
    state, hdr = decode_header(raw)
    assert state is HeaderState.VALID
    assert hdr is not None
    assert (hdr.key, hdr.generation, hdr.length, hdr.checksum, hdr.depth) == (
        key,
        gen,
        length,
        checksum,
        depth,
    )


@given(pos=st.integers(0, 167), bit=st.integers(0, 7))
def test_any_flipped_bit_in_header_is_detected(pos: int, bit: int) -> None:
    raw = bytearray(encode_header(b"k" * 34, 7, 4096, 123, 2))
    raw[pos] ^= 1 << bit
    state, hdr = decode_header(bytes(raw))
    assert state is not HeaderState.VALID
    assert hdr is None


def test_empty_header() -> None:
    assert decode_header(bytes(HEADER_BYTES)) == (HeaderState.EMPTY, None)


def test_key_too_long() -> None:
    with pytest.raises(ValueError, match="at most"):
        encode_header(b"x" * (MAX_KEY_BYTES + 1), 1, 1, 1)


def test_superblock_round_trip_and_errors(make_config: MakeConfig) -> None:
    cfg = make_config()
    sb = expected_superblock(cfg, 0, L2_MAGIC, cfg.l2_slots, cfg.l2_payload_bytes)
    raw = sb.encode()
    assert Superblock.decode(raw, L2_MAGIC) == sb
    with pytest.raises(LayoutMismatchError, match="bad magic"):
        Superblock.decode(raw, L1_MAGIC)
    bad = bytearray(raw)
    bad[8] = 99  # version
    with pytest.raises(LayoutMismatchError, match="format version 99"):
        Superblock.decode(bytes(bad), L2_MAGIC)
    bad = bytearray(raw)
    bad[40] ^= 1
    with pytest.raises(LayoutMismatchError, match="checksum"):
        Superblock.decode(bytes(bad), L2_MAGIC)
