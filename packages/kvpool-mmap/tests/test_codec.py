"""Slot header and superblock codecs: round trips, every corruption detected."""

from __future__ import annotations

import pytest
from conftest import MakeConfig
from hypothesis import given, settings
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


@settings(deadline=None)
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


@settings(deadline=None)
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


@settings(deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.binary(max_size=MAX_KEY_BYTES),
            st.integers(0, 2**64 - 1),
            st.sampled_from(["valid", "empty", "flip", "garbage"]),
            st.integers(0, HEADER_BYTES - 1),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_table_decoder_agrees_with_row_decoder(rows: list[tuple[bytes, int, str, int]]) -> None:
    import numpy as np
    from kvpool_mmap._codec import decode_table

    raw = bytearray()
    for k, gen, kind, pos in rows:
        h = bytearray(encode_header(k, gen, 4096, gen ^ 1, len(k)))
        if kind == "empty":
            h = bytearray(HEADER_BYTES)
        elif kind == "flip":
            h[pos] ^= 0x20
        elif kind == "garbage":
            h = bytearray((i * 37 + pos) % 256 for i in range(HEADER_BYTES))
        raw += h
    table = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(len(rows), HEADER_BYTES)
    valid, corrupt = decode_table(table)
    for slot in range(len(rows)):
        state, hdr = decode_header(table[slot].tobytes())
        if state is HeaderState.VALID:
            assert valid[slot] == hdr
        else:
            assert slot not in valid
            assert (slot in corrupt) == (state is HeaderState.CORRUPT)
