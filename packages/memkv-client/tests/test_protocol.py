"""Frame codecs: golden bytes, round trips, the sans-I/O decoder, auth primitives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memkv_client import protocol as p
from memkv_client.auth import ClockWindow, Signer, parse_key

# A version-3 HELLO request header, id 1, timestamp 0x0102030405060708, 18 bytes of meta.
GOLDEN_HELLO = bytes.fromhex("4d4b030100000000010000000807060504030201120000000000000000000000")


def test_golden_header() -> None:
    h = p.Header(3, p.Op.HELLO, 0, 0, 1, 0x0102030405060708, 18, 0)
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


def test_hello_round_trips() -> None:
    nonce = bytes(range(16))
    assert p.encode_hello(nonce) == b"\x03\x03" + nonce
    assert p.decode_hello(p.encode_hello(nonce) + b"future") == (3, 3, nonce)
    with pytest.raises(p.FrameError):
        p.decode_hello(b"\x01\x01")  # a version-1 HELLO has no nonce
    info = p.ServerInfo(
        3, 512, 1024, 1 << 20, 1 << 30, 1 << 32, True, "node-1", False, b"b" * 16, b"c" * 16, 9
    )
    assert p.decode_hello_reply(p.encode_hello_reply(info)) == info


def test_put_and_get_reply_digests_round_trip() -> None:
    items = [(b"k", 3, b"\x01" * 32), (b"kk", 0, b"\x02" * 32)]
    assert p.decode_put_items(p.encode_put_items(items)) == items
    replies = [(0, 3, b"\x03" * 32), (1, 0, p.NO_DIGEST)]
    assert p.decode_get_reply(p.encode_get_reply(replies), 2) == replies
    with pytest.raises(p.FrameError):
        p.decode_put_items(p.encode_key_lengths([(b"k", 3)]))  # version-1 PUT meta


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
    ok = p.Header(3, p.Op.GET, 0, 0, 1, 0, 0, 0)
    assert p.check_request_header(ok, 1 << 30) is p.Op.GET
    cases = [
        (p.Header(9, p.Op.GET, 0, 0, 1, 0, 0, 0), p.Status.UNSUPPORTED_VERSION),
        (p.Header(1, p.Op.GET, 0, 0, 1, 0, 0, 0), p.Status.UNSUPPORTED_VERSION),
        (p.Header(3, 0x77, 0, 0, 1, 0, 0, 0), p.Status.INVALID_OPCODE),
        (p.Header(3, p.Op.GET, 0, p.FLAG_RESPONSE, 1, 0, 0, 0), p.Status.INVALID_REQUEST),
        (p.Header(3, p.Op.GET, 0, 0, 1, 0, p.MAX_META_LEN + 1, 0), p.Status.PAYLOAD_TOO_LARGE),
        (p.Header(3, p.Op.PUT, 0, 0, 1, 0, 0, 2 << 30), p.Status.PAYLOAD_TOO_LARGE),
        (p.Header(3, p.Op.GET, 0, 0, 1, 0, 0, 10), p.Status.INVALID_REQUEST),
        (p.Header(3, p.Op.HELLO, 0, 0, 1, 0, 18, 0), p.Status.INVALID_REQUEST),  # a second one
        (p.Header(3, p.Op.AUTH, 0, 0, 1, 0, 16, 0), p.Status.INVALID_REQUEST),  # a second one
        (p.Header(2, p.Op.GET, 0, 0, 1, 0, 0, 0), p.Status.UNSUPPORTED_VERSION),  # v2 client
    ]
    for h, status in cases:
        with pytest.raises(p.FrameError) as info:
            p.check_request_header(h, 1 << 30)
        assert info.value.status is status


def test_before_auth_only_a_small_hello_and_auth_are_read() -> None:
    hello = p.Header(3, p.Op.HELLO, 0, 0, 1, 0, 18, 0)
    assert p.check_request_header(hello, 1 << 30, authenticated=False) is p.Op.HELLO
    auth = p.Header(3, p.Op.AUTH, 0, 0, 2, 0, 16, 0)
    assert p.check_request_header(auth, 1 << 30, authenticated=False) is p.Op.AUTH
    for h, status in [
        (
            p.Header(3, p.Op.HELLO, 0, 0, 1, 0, p.PREAUTH_MAX_META_LEN + 1, 0),
            p.Status.PAYLOAD_TOO_LARGE,
        ),
        (
            p.Header(3, p.Op.AUTH, 0, 0, 1, 0, p.PREAUTH_MAX_META_LEN + 1, 0),
            p.Status.PAYLOAD_TOO_LARGE,
        ),
        (p.Header(3, p.Op.GET, 0, 0, 1, 0, 0, 0), p.Status.INVALID_REQUEST),
        (p.Header(3, p.Op.PUT, 0, 0, 1, 0, 0, 5), p.Status.INVALID_REQUEST),
    ]:
        with pytest.raises(p.FrameError) as info:
            p.check_request_header(h, 1 << 30, authenticated=False)
        assert info.value.status is status
    with pytest.raises(p.FrameError) as info:
        p.unpack_header(b"XX" + GOLDEN_HELLO[2:])
    assert info.value.status is p.Status.INVALID_MAGIC


def test_frame_decoder_waits_for_whole_frames() -> None:
    meta = p.encode_key_lengths([(b"k", 3)])
    header = p.Header(3, p.Op.PUT, 0, 0, 5, 0, len(meta), 3).pack()
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
    incremental = s.start(b"header")
    incremental.update(b"me")
    incremental.update(b"ta")
    assert Signer.check(incremental, mac)
    with pytest.raises(ValueError, match="32 bytes"):
        Signer(b"short")
    with pytest.raises(ValueError, match="all-zero"):
        Signer(bytes(32))
    assert parse_key("11" * 32) == b"\x11" * 32
    with pytest.raises(ValueError, match="64 hex"):
        parse_key("11")
    with pytest.raises(ValueError, match="all-zero"):
        parse_key("00" * 32)


def test_auth_echoes_the_challenge() -> None:
    challenge = bytes(range(16))
    assert p.decode_auth(p.encode_auth(challenge)) == challenge
    with pytest.raises(p.FrameError):
        p.decode_auth(challenge + b"x")


def test_a_version_2_client_is_told_to_upgrade() -> None:
    with pytest.raises(
        p.FrameError, match=r"version 2; this server speaks 3\.\.3: upgrade the client"
    ):
        p.check_request_header(p.Header(2, p.Op.HELLO, 0, 0, 1, 0, 18, 0), 1 << 30, False)


def test_session_keys_differ_per_nonce() -> None:
    s = Signer(b"\x11" * 32)
    a = s.session(b"c" * 16, b"b" * 16, b"1" * 16).sign(b"h", b"m")
    assert a == s.session(b"c" * 16, b"b" * 16, b"1" * 16).sign(b"h", b"m")
    assert a != s.session(b"c" * 16, b"b" * 16, b"2" * 16).sign(b"h", b"m")  # challenge
    assert a != s.session(b"c" * 16, b"B" * 16, b"1" * 16).sign(b"h", b"m")  # boot
    assert a != s.hello_reply(b"c" * 16).sign(b"h", b"m")
    assert a != s.sign(b"h", b"m")


def test_clock_window() -> None:
    now = [1_000_000_000_000]
    window = ClockWindow(window_ns=5_000, clock=lambda: now[0])
    assert window.check(now[0]) is p.Status.OK
    assert window.check(now[0] - 5_001) is p.Status.CLOCK_DRIFT
    assert window.check(now[0] + 5_001) is p.Status.CLOCK_DRIFT
