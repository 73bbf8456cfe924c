"""MemKV wire protocol: constants, frame header and per-opcode metadata codecs.

Sans-I/O: nothing here touches a socket. See `docs/memkv-protocol.md` for the
specification. Every frame is::

    header (32 bytes) | mac (32 bytes) | meta (meta_len bytes) | bulk (bulk_len bytes)

All integers are little-endian. The MAC is HMAC-SHA256 over `header || meta` with a
per-connection session key (see `.auth`); value bytes are covered by BLAKE3
digests inside `meta`. A connection opens with `HELLO` (the reply carries a fresh
challenge) and `AUTH` (signed with the session key derived from that challenge).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"MK"
VERSION = 3
MIN_VERSION = 3
MAX_VERSION = 3

HEADER = struct.Struct("<2sBBHHIQIQ")
HEADER_SIZE = HEADER.size  # 32
MAC_SIZE = 32
PREFIX_SIZE = HEADER_SIZE + MAC_SIZE  # 64

FLAG_RESPONSE = 0x0001
KNOWN_FLAGS = FLAG_RESPONSE

HELLO_RDMA = 0x01  #: HELLO reply flags: the server serves one-sided RDMA
HELLO_XFER = 0x02  #: HELLO reply flags: the server implements RDMA_XFER

MAX_KEY_LEN = 512
MAX_BATCH_ITEMS = 1024
MAX_META_LEN = 1 << 20
PREAUTH_MAX_META_LEN = 1024  #: largest meta a server reads before a verified AUTH
NONCE_SIZE = 16
DIGEST_SIZE = 32  #: BLAKE3 of a value, carried in PUT requests and GET replies
NO_DIGEST = bytes(DIGEST_SIZE)
DEFAULT_MAX_VALUE_LEN = 1 << 30
DEFAULT_MAX_BULK_LEN = 1 << 32

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_STATUS_LEN = struct.Struct("<BQ")
_ADDR_RKEY = struct.Struct("<QQI")  # length, remote address, rkey
_XFER_ITEM = struct.Struct("<QQQI")  # value offset, length, remote address, rkey
_HELLO_REQ = struct.Struct(f"<BB{NONCE_SIZE}s")
_HELLO_RESP = struct.Struct(f"<BHIIQQB{NONCE_SIZE}s{NONCE_SIZE}sI")
_KEY_LEN = struct.Struct("<Q")
_STATUS_LEN_DIGEST = struct.Struct(f"<BQ{DIGEST_SIZE}s")


class Op(enum.IntEnum):
    """Opcodes (one byte)."""

    HELLO = 0x01
    EXISTS = 0x02
    PUT = 0x03
    GET = 0x04
    DELETE = 0x05
    SIZE = 0x06
    STATS = 0x07
    RDMA_CONNECT = 0x08
    RDMA_PUT = 0x09
    RDMA_GET = 0x0A
    RDMA_XFER = 0x0B
    AUTH = 0x0C  #: answers the HELLO reply's challenge; required before any other op


class Status(enum.IntEnum):
    """Frame-level (u16 in the header) and per-item (u8 in metadata) status codes."""

    OK = 0
    NOT_FOUND = 1
    SIZE_MISMATCH = 2
    NO_SPACE = 3
    VALUE_TOO_LARGE = 4
    KEY_TOO_LONG = 5
    INVALID_REQUEST = 6
    SERVER_ERROR = 7
    BAD_MAC = 8
    CLOCK_DRIFT = 9
    REPLAY = 10
    UNSUPPORTED_VERSION = 11
    INVALID_MAGIC = 12
    INVALID_OPCODE = 13
    MESSAGE_TOO_SHORT = 14
    PAYLOAD_TOO_LARGE = 15
    BATCH_TOO_LARGE = 16
    UNSUPPORTED = 17
    SHUTTING_DOWN = 18
    TRANSFER_FAILED = 19


class FrameError(ValueError):
    """A frame (or its metadata) cannot be decoded; carries the status to answer with."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed 32-byte frame header (the MAC travels separately)."""

    version: int
    op: int
    status: int
    flags: int
    request_id: int
    timestamp_ns: int
    meta_len: int
    bulk_len: int

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.version,
            self.op,
            self.status,
            self.flags,
            self.request_id,
            self.timestamp_ns,
            self.meta_len,
            self.bulk_len,
        )


def unpack_header(data: bytes | bytearray | memoryview) -> Header:
    """Decode the 32-byte header; raises `FrameError` on a bad magic."""
    if len(data) < HEADER_SIZE:
        raise FrameError(Status.MESSAGE_TOO_SHORT, f"header needs {HEADER_SIZE} bytes")
    magic, version, op, status, flags, rid, ts, meta_len, bulk_len = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(Status.INVALID_MAGIC, f"invalid magic {bytes(magic)!r}")
    return Header(version, op, status, flags, rid, ts, meta_len, bulk_len)


def check_request_header(h: Header, max_bulk_len: int, authenticated: bool = True) -> Op:
    """Validate a request header against this implementation's limits; return its opcode.

    Before the connection's AUTH has verified (`authenticated=False`) only HELLO and
    AUTH frames of at most `PREAUTH_MAX_META_LEN` metadata bytes are accepted (the
    connection enforces their order).
    """
    if not MIN_VERSION <= h.version <= MAX_VERSION:
        upgrade = "the client (memkv-client)" if h.version < MIN_VERSION else "this server"
        raise FrameError(
            Status.UNSUPPORTED_VERSION,
            f"unsupported version {h.version}; this server speaks {MIN_VERSION}..{MAX_VERSION}"
            f": upgrade {upgrade} so both sides speak the same version",
        )
    if h.flags & ~KNOWN_FLAGS or h.is_response:
        raise FrameError(Status.INVALID_REQUEST, f"invalid flags {h.flags:#x}")
    try:
        op = Op(h.op)
    except ValueError:
        raise FrameError(Status.INVALID_OPCODE, f"invalid opcode {h.op:#x}") from None
    if not authenticated:
        if op not in (Op.HELLO, Op.AUTH):
            raise FrameError(Status.INVALID_REQUEST, f"{op.name} before HELLO and AUTH")
        if h.meta_len > PREAUTH_MAX_META_LEN:
            raise FrameError(
                Status.PAYLOAD_TOO_LARGE,
                f"{op.name} meta_len {h.meta_len} > {PREAUTH_MAX_META_LEN}",
            )
    elif op in (Op.HELLO, Op.AUTH):
        raise FrameError(Status.INVALID_REQUEST, f"{op.name} on an authenticated connection")
    if h.meta_len > MAX_META_LEN:
        raise FrameError(Status.PAYLOAD_TOO_LARGE, f"meta_len {h.meta_len} > {MAX_META_LEN}")
    if h.bulk_len > max_bulk_len:
        raise FrameError(Status.PAYLOAD_TOO_LARGE, f"bulk_len {h.bulk_len} > {max_bulk_len}")
    if h.bulk_len and op not in (Op.PUT,):
        raise FrameError(Status.INVALID_REQUEST, f"{op.name} carries no bulk data")
    return op


# --- metadata cursor -----------------------------------------------------------------


class Reader:
    """Typed cursor over metadata bytes; short reads raise `MESSAGE_TOO_SHORT`."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self._pos = 0

    def _take(self, n: int) -> int:
        pos = self._pos
        if pos + n > len(self._data):
            raise FrameError(Status.MESSAGE_TOO_SHORT, "metadata truncated")
        self._pos = pos + n
        return pos

    def u8(self) -> int:
        return self._data[self._take(1)]

    def u16(self) -> int:
        return int(_U16.unpack_from(self._data, self._take(2))[0])

    def u32(self) -> int:
        return int(_U32.unpack_from(self._data, self._take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack_from(self._data, self._take(8))[0])

    def raw(self, n: int) -> bytes:
        pos = self._take(n)
        return bytes(self._data[pos : pos + n])

    def key(self) -> bytes:
        n = self.u16()
        if n > MAX_KEY_LEN:
            raise FrameError(Status.KEY_TOO_LONG, f"key of {n} bytes > {MAX_KEY_LEN}")
        if n == 0:
            raise FrameError(Status.INVALID_REQUEST, "empty key")
        return self.raw(n)

    def count(self, limit: int = MAX_BATCH_ITEMS) -> int:
        n = self.u32()
        if n > limit:
            raise FrameError(Status.BATCH_TOO_LARGE, f"batch of {n} items > {limit}")
        return n

    def rest(self) -> bytes:
        pos = self._take(len(self._data) - self._pos)
        return bytes(self._data[pos:])

    def end(self) -> None:
        if self._pos != len(self._data):
            raise FrameError(Status.INVALID_REQUEST, "trailing bytes after metadata")


def _key(k: bytes) -> bytes:
    return _U16.pack(len(k)) + k


# --- per-opcode metadata (requests) ----------------------------------------------------


def encode_hello(
    client_nonce: bytes, min_version: int = MIN_VERSION, max_version: int = MAX_VERSION
) -> bytes:
    """HELLO request: `u8 min_version, u8 max_version, 16-byte client nonce`."""
    return _HELLO_REQ.pack(min_version, max_version, client_nonce)


def decode_hello(meta: bytes) -> tuple[int, int, bytes]:
    """`(min_version, max_version, client_nonce)`; later bytes are room for future fields."""
    if len(meta) < _HELLO_REQ.size:
        raise FrameError(Status.MESSAGE_TOO_SHORT, "HELLO needs versions and a client nonce")
    lo, hi, nonce = _HELLO_REQ.unpack_from(meta)
    return lo, hi, bytes(nonce)


def encode_auth(challenge: bytes) -> bytes:
    """AUTH request: the 16-byte challenge of the HELLO reply, echoed. What proves the
    key is the frame's MAC: it is computed under the session key, which is derived from
    the key and this challenge."""
    return bytes(challenge)


def decode_auth(meta: bytes) -> bytes:
    """The challenge an AUTH request answers."""
    if len(meta) != NONCE_SIZE:
        raise FrameError(Status.INVALID_REQUEST, f"AUTH carries the {NONCE_SIZE}-byte challenge")
    return bytes(meta)


def encode_keys(keys: Sequence[bytes]) -> bytes:
    """EXISTS / DELETE / SIZE requests: `u32 count, count x key`."""
    return b"".join([_U32.pack(len(keys)), *map(_key, keys)])


def decode_keys(meta: bytes, limit: int = MAX_BATCH_ITEMS) -> list[bytes]:
    r = Reader(meta)
    keys = [r.key() for _ in range(r.count(limit))]
    r.end()
    return keys


def encode_key_lengths(items: Sequence[tuple[bytes, int]]) -> bytes:
    """PUT / GET requests: `u32 count, count x (key, u64 length)`."""
    parts = [_U32.pack(len(items))]
    for k, n in items:
        parts.append(_key(k))
        parts.append(_U64.pack(n))
    return b"".join(parts)


def decode_key_lengths(meta: bytes, limit: int = MAX_BATCH_ITEMS) -> list[tuple[bytes, int]]:
    r = Reader(meta)
    out = [(r.key(), r.u64()) for _ in range(r.count(limit))]
    r.end()
    return out


def encode_put_items(items: Sequence[tuple[bytes, int, bytes]]) -> bytes:
    """PUT requests: `u32 count, count x (key, u64 length, 32-byte BLAKE3 of the value)`."""
    parts = [_U32.pack(len(items))]
    for k, n, digest in items:
        parts.append(_key(k))
        parts.append(_KEY_LEN.pack(n))
        parts.append(digest)
    return b"".join(parts)


def decode_put_items(meta: bytes, limit: int = MAX_BATCH_ITEMS) -> list[tuple[bytes, int, bytes]]:
    r = Reader(meta)
    out = [(r.key(), r.u64(), r.raw(DIGEST_SIZE)) for _ in range(r.count(limit))]
    r.end()
    return out


def encode_remote_items(items: Sequence[tuple[bytes, int, int, int]]) -> bytes:
    """RDMA_PUT / RDMA_GET: `u32 count, count x (key, u64 len, u64 addr, u32 rkey)`."""
    parts = [_U32.pack(len(items))]
    for k, n, addr, rkey in items:
        parts.append(_key(k))
        parts.append(_ADDR_RKEY.pack(n, addr, rkey))
    return b"".join(parts)


def decode_remote_items(
    meta: bytes, limit: int = MAX_BATCH_ITEMS
) -> list[tuple[bytes, int, int, int]]:
    r = Reader(meta)
    out = []
    for _ in range(r.count(limit)):
        k = r.key()
        out.append((k, r.u64(), r.u64(), r.u32()))
    r.end()
    return out


def encode_xfer(is_write: bool, items: Sequence[tuple[bytes, int, int, int, int]]) -> bytes:
    """RDMA_XFER: `u8 is_write, u32 count, count x (key, u64 value_offset, u64 len,
    u64 addr, u32 rkey)`."""
    parts = [bytes([int(is_write)]), _U32.pack(len(items))]
    for k, offset, n, addr, rkey in items:
        parts.append(_key(k))
        parts.append(_XFER_ITEM.pack(offset, n, addr, rkey))
    return b"".join(parts)


def decode_xfer(
    meta: bytes, limit: int = MAX_BATCH_ITEMS
) -> tuple[bool, list[tuple[bytes, int, int, int, int]]]:
    r = Reader(meta)
    direction = r.u8()
    if direction > 1:
        raise FrameError(Status.INVALID_REQUEST, f"RDMA_XFER direction {direction} (0 or 1)")
    out = []
    for _ in range(r.count(limit)):
        k = r.key()
        out.append((k, r.u64(), r.u64(), r.u64(), r.u32()))
    r.end()
    return bool(direction), out


def xfer_pieces(
    items: Sequence[tuple[bytes, int, int, int, int]],
) -> dict[bytes, tuple[int, list[int]]]:
    """Group RDMA_XFER *write* items by key: `{key: (value length, item indices)}`.

    The items of one key are the pieces of one new value; together they must cover
    `[0, value length)` exactly, without gaps or overlaps. Raises `FrameError`
    (INVALID_REQUEST) otherwise.
    """
    groups: dict[bytes, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(item[0], []).append(i)
    out: dict[bytes, tuple[int, list[int]]] = {}
    for key, idx in groups.items():
        end = 0
        for i in sorted(idx, key=lambda i: items[i][1]):
            offset, n = items[i][1], items[i][2]
            if offset != end:
                what = "overlap" if offset < end else "gap"
                raise FrameError(
                    Status.INVALID_REQUEST,
                    f"pieces of {key[:40]!r} do not tile the value ({what} at byte {min(offset, end)})",
                )
            end = offset + n
        out[key] = (end, idx)
    return out


# --- per-opcode metadata (responses) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What HELLO negotiates: the version and the server's limits."""

    version: int
    max_key_len: int
    max_batch_items: int
    max_meta_len: int
    max_value_len: int
    max_bulk_len: int
    rdma: bool
    server_id: str
    xfer: bool = False  #: RDMA_XFER is implemented (HELLO flag bit 1)
    boot_nonce: bytes = bytes(NONCE_SIZE)  #: random per server start
    challenge: bytes = bytes(NONCE_SIZE)  #: random per connection; AUTH answers it
    idle_timeout_ms: int = 0  #: the server closes connections idle this long (0: never)


def encode_hello_reply(info: ServerInfo) -> bytes:
    return (
        _HELLO_RESP.pack(
            info.version,
            info.max_key_len,
            info.max_batch_items,
            info.max_meta_len,
            info.max_value_len,
            info.max_bulk_len,
            (HELLO_RDMA if info.rdma else 0) | (HELLO_XFER if info.xfer else 0),
            info.boot_nonce,
            info.challenge,
            info.idle_timeout_ms,
        )
        + info.server_id.encode()
    )


def decode_hello_reply(meta: bytes) -> ServerInfo:
    if len(meta) < _HELLO_RESP.size:
        raise FrameError(Status.MESSAGE_TOO_SHORT, "HELLO reply truncated")
    v, klen, batch, mlen, vlen, blen, flags, boot, challenge, idle = _HELLO_RESP.unpack_from(meta)
    sid = bytes(meta[_HELLO_RESP.size :]).decode(errors="replace")
    return ServerInfo(
        v, klen, batch, mlen, vlen, blen, bool(flags & HELLO_RDMA), sid,
        bool(flags & HELLO_XFER), bytes(boot), bytes(challenge), idle,
    )  # fmt: skip


def encode_flags(values: Sequence[int]) -> bytes:
    """EXISTS / PUT / DELETE / RDMA_PUT replies: `u32 count, count x u8`."""
    return _U32.pack(len(values)) + bytes(values)


def decode_flags(meta: bytes, expect: int) -> list[int]:
    r = Reader(meta)
    n = r.u32()
    if n != expect:
        raise FrameError(Status.INVALID_REQUEST, f"reply has {n} items, expected {expect}")
    out = list(r.raw(n))
    r.end()
    return out


def encode_status_lengths(items: Sequence[tuple[int, int]]) -> bytes:
    """GET / SIZE / RDMA_GET replies: `u32 count, count x (u8 status, u64 length)`."""
    return _U32.pack(len(items)) + b"".join(_STATUS_LEN.pack(s, n) for s, n in items)


def decode_status_lengths(meta: bytes, expect: int) -> list[tuple[int, int]]:
    r = Reader(meta)
    n = r.u32()
    if n != expect:
        raise FrameError(Status.INVALID_REQUEST, f"reply has {n} items, expected {expect}")
    out = [(r.u8(), r.u64()) for _ in range(n)]
    r.end()
    return out


def encode_get_reply(items: Sequence[tuple[int, int, bytes]]) -> bytes:
    """GET replies: `u32 count, count x (u8 status, u64 length, 32-byte BLAKE3)`; the
    digest is the stored value's for `OK` items and zeros otherwise."""
    return _U32.pack(len(items)) + b"".join(_STATUS_LEN_DIGEST.pack(*i) for i in items)


def decode_get_reply(meta: bytes, expect: int) -> list[tuple[int, int, bytes]]:
    r = Reader(meta)
    n = r.u32()
    if n != expect:
        raise FrameError(Status.INVALID_REQUEST, f"reply has {n} items, expected {expect}")
    out = [(r.u8(), r.u64(), r.raw(DIGEST_SIZE)) for _ in range(n)]
    r.end()
    return out


def status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return f"STATUS_{code}"


# --- a sans-I/O frame decoder ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    header: Header
    mac: bytes
    meta: bytes
    bulk: bytes


class FrameDecoder:
    """Bytes in, whole frames out. A partial frame is left in the buffer untouched.

    The server streams bulk data straight into its store instead; this decoder serves
    tests, tools and fuzzing, and shares `unpack_header` with the server.
    """

    def __init__(self, max_bulk_len: int = DEFAULT_MAX_BULK_LEN) -> None:
        self._buf = bytearray()
        self._max_bulk = max_bulk_len

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or None if more data is needed."""
        if len(self._buf) < PREFIX_SIZE:
            return None
        h = unpack_header(self._buf)
        if h.meta_len > MAX_META_LEN or h.bulk_len > self._max_bulk:
            raise FrameError(Status.PAYLOAD_TOO_LARGE, "frame exceeds limits")
        total = PREFIX_SIZE + h.meta_len + h.bulk_len
        if len(self._buf) < total:
            return None
        mac = bytes(self._buf[HEADER_SIZE:PREFIX_SIZE])
        meta = bytes(self._buf[PREFIX_SIZE : PREFIX_SIZE + h.meta_len])
        bulk = bytes(self._buf[PREFIX_SIZE + h.meta_len : total])
        del self._buf[:total]
        return Frame(h, mac, meta, bulk)
