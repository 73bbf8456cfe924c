"""Frame codecs: golden bytes, round trips, the sans-I/O decoder, auth primitives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memkv_client import protocol as p
from memkv_client.auth import ReplayGuard, Signer, parse_key

# A HELLO request, id 1, timestamp 0x0102030405060708, signed with key 0x11 * 32.
GOLDEN_HELLO = bytes.fromhex("4d4b010100000000010000000807060504030201020000000000000000000000")


def test_golden_header() -> None:
    h = p.Header(1, p.Op.HELLO, 0, 0, 1, 0x0102030405060708, 2, 0)
    assert h.pack() == GOLDEN_HELLO
    assert p.unpack_header(GOLDEN_HELLO) == h
    assert p.HEADER_SIZE == 32
    assert p.PREFIX_SIZE == 64


def test_golden_keys_meta() -> None:
    assert p.encode_keys([b"ab", b"c"]) == bytes.fromhex("0200000002006162010063")
    assert p.decode_keys(bytes.fromhex("0100000001007a")) == [b"z"]


keys = st.binary(min_size=1, max_size=p.MAX_KEY_LEN)


@given(st.lists(keys, max_size=20))
def test_keys_round_trip(ks: list[bytes]) -> None:
    assert p.decode_keys(p.encode_keys(ks)) == ks


@given(st.lists(st.tuples(keys, st.integers(0, 2**64 - 1)), max_size=20))
def test_key_lengths_round_trip(items: list[tuple[bytes, int]]) -> None:
    assert p.decode_key_lengths(p.encode_key_lengths(items)) == items


@given(
    st.lists(
        st.tuples(
            keys, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)
        ),
        max_size=10,
    )
)
def test_remote_items_round_trip(items: list[tuple[bytes, int, int, int]]) -> None:
    assert p.decode_remote_items(p.encode_remote_items(items)) == items


@given(st.lists(st.tuples(st.integers(0, 255), st.integers(0, 2**64 - 1)), max_size=20))
def test_status_lengths_round_trip(items: list[tuple[int, int]]) -> None:
    assert p.decode_status_lengths(p.encode_status_lengths(items), len(items)) == items


def test_hello_reply_round_trip() -> None:
    info = p.ServerInfo(1, 512, 1024, 1 << 20, 1 << 30, 1 << 32, True, "node-1")
    assert p.decode_hello_reply(p.encode_hello_reply(info)) == info


def test_hello_reply_feature_flags() -> None:
    plain = p.ServerInfo(1, 512, 1024, 1 << 20, 1 << 30, 1 << 32, True, "n")
    assert p.encode_hello_reply(plain)[27] == 0x01  # unchanged for servers without XFER
    xfer = p.ServerInfo(1, 512, 1024, 1 << 20, 1 << 30, 1 << 32, True, "n", xfer=True)
    assert p.encode_hello_reply(xfer)[27] == 0x03
    assert p.decode_hello_reply(p.encode_hello_reply(xfer)) == xfer


def test_golden_xfer_meta() -> None:
    meta = p.encode_xfer(True, [(b"k", 2, 3, 0x10, 7)])
    assert meta == bytes.fromhex(
        "01" "01000000" "01006b" "0200000000000000" "0300000000000000" "1000000000000000" "07000000"
    )  # fmt: skip
    assert p.decode_xfer(meta) == (True, [(b"k", 2, 3, 0x10, 7)])


u64 = st.integers(0, 2**64 - 1)


@given(st.booleans(), st.lists(st.tuples(keys, u64, u64, u64, st.integers(0, 2**32 - 1))))
def test_xfer_round_trip(is_write: bool, items: list[tuple[bytes, int, int, int, int]]) -> None:
    assert p.decode_xfer(p.encode_xfer(is_write, items)) == (is_write, items)


def test_xfer_bad_direction() -> None:
    with pytest.raises(p.FrameError, match="direction 2"):
        p.decode_xfer(b"\x02\x00\x00\x00\x00")


def test_xfer_pieces_tile_each_value() -> None:
    items = [(b"a", 5, 5, 0, 0), (b"b", 0, 0, 0, 0), (b"a", 0, 5, 0, 0), (b"a", 10, 1, 0, 0)]
    assert p.xfer_pieces(items) == {b"a": (11, [0, 2, 3]), b"b": (0, [1])}
    for bad, what in [
        ([(b"a", 1, 5, 0, 0)], "gap at byte 0"),
        ([(b"a", 0, 5, 0, 0), (b"a", 6, 5, 0, 0)], "gap at byte 5"),
        ([(b"a", 0, 5, 0, 0), (b"a", 4, 5, 0, 0)], "overlap at byte 4"),
        ([(b"a", 0, 5, 0, 0), (b"a", 0, 5, 0, 0)], "overlap at byte 0"),
    ]:
        with pytest.raises(p.FrameError, match=what) as info:
            p.xfer_pieces(bad)
        assert info.value.status is p.Status.INVALID_REQUEST


@pytest.mark.parametrize(
    ("meta", "status"),
    [
        (b"\x01\x00\x00\x00\x01\x02" + b"x" * 0x201, p.Status.KEY_TOO_LONG),
        (b"\x01\x00\x00\x00\x00\x00", p.Status.INVALID_REQUEST),  # empty key
        (b"\x01\x00\x00\x00\x05\x00ab", p.Status.MESSAGE_TOO_SHORT),
        (b"\xff\xff\x00\x00", p.Status.BATCH_TOO_LARGE),
        (b"\x00\x00\x00\x00junk", p.Status.INVALID_REQUEST),
    ],
)
def test_bad_metadata(meta: bytes, status: p.Status) -> None:
    with pytest.raises(p.FrameError) as info:
        p.decode_keys(meta)
    assert info.value.status is status


def test_header_checks() -> None:
    ok = p.Header(1, p.Op.GET, 0, 0, 1, 0, 0, 0)
    assert p.check_request_header(ok, 1 << 30) is p.Op.GET
    cases = [
        (p.Header(9, p.Op.GET, 0, 0, 1, 0, 0, 0), p.Status.UNSUPPORTED_VERSION),
        (p.Header(1, 0x77, 0, 0, 1, 0, 0, 0), p.Status.INVALID_OPCODE),
        (p.Header(1, p.Op.GET, 0, p.FLAG_RESPONSE, 1, 0, 0, 0), p.Status.INVALID_REQUEST),
        (p.Header(1, p.Op.GET, 0, 0, 1, 0, p.MAX_META_LEN + 1, 0), p.Status.PAYLOAD_TOO_LARGE),
        (p.Header(1, p.Op.PUT, 0, 0, 1, 0, 0, 2 << 30), p.Status.PAYLOAD_TOO_LARGE),
        (p.Header(1, p.Op.GET, 0, 0, 1, 0, 0, 10), p.Status.INVALID_REQUEST),
    ]
    for h, status in cases:
        with pytest.raises(p.FrameError) as info:
            p.check_request_header(h, 1 << 30)
        assert info.value.status is status
    with pytest.raises(p.FrameError) as info:
        p.unpack_header(b"XX" + GOLDEN_HELLO[2:])
    assert info.value.status is p.Status.INVALID_MAGIC


def test_frame_decoder_waits_for_whole_frames() -> None:
    meta = p.encode_key_lengths([(b"k", 3)])
    header = p.Header(1, p.Op.PUT, 0, 0, 5, 0, len(meta), 3).pack()
    frame = header + b"\x00" * 32 + meta + b"abc"
    dec = p.FrameDecoder()
    for i in range(len(frame) - 1):  # byte by byte: nothing until the last byte
        dec.feed(frame[i : i + 1])
        assert dec.next_frame() is None
    dec.feed(frame[-1:] + frame)
    first, second = dec.next_frame(), dec.next_frame()
    assert first is not None
    assert first == second
    assert first.bulk == b"abc"
    assert first.header.request_id == 5
    assert dec.next_frame() is None


def test_signer() -> None:
    s = Signer(b"\x11" * 32)
    mac = s.sign(b"header", b"meta")
    assert s.verify(b"header", b"meta", mac)
    assert not s.verify(b"header", b"meta!", mac)
    assert not Signer(b"\x12" * 32).verify(b"header", b"meta", mac)
    with pytest.raises(ValueError, match="32 bytes"):
        Signer(b"short")
    assert parse_key("11" * 32) == b"\x11" * 32
    with pytest.raises(ValueError, match="64 hex"):
        parse_key("11")


def test_replay_guard_window_and_replays() -> None:
    now = [1_000_000_000_000]
    guard = ReplayGuard(window_ns=5_000, clock=lambda: now[0])
    assert guard.check(now[0], b"a" * 32) is p.Status.OK
    assert guard.check(now[0], b"a" * 32) is p.Status.REPLAY
    assert guard.check(now[0] - 5_001, b"b" * 32) is p.Status.CLOCK_DRIFT
    assert guard.check(now[0] + 5_001, b"b" * 32) is p.Status.CLOCK_DRIFT
    assert guard.check(now[0] + 4_000, b"c" * 32) is p.Status.OK
    now[0] += 9_000  # within 2 x window of the originals: still remembered
    assert guard.check(now[0] - 4_000, b"c" * 32) is p.Status.REPLAY
    now[0] += 2_000  # older than 2 x window: a copy could no longer pass the clock check
    assert guard.check(now[0], b"d" * 32) is p.Status.OK
    assert len(guard) == 1


def test_replay_guard_is_bounded() -> None:
    guard = ReplayGuard(window_ns=10**12, clock=lambda: 0, max_entries=3)
    for i in range(3):
        assert guard.check(0, bytes([i]) * 32) is p.Status.OK
    assert guard.check(0, b"\x09" * 32) is p.Status.REPLAY  # full: refuse rather than grow
