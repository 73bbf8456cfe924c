"""Turning caller arguments (keys, buffers, raw addresses) into bytes and memoryviews."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from .errors import KeyTooLongError, LocalProtocolError
from .protocol import MAX_KEY_LEN

__all__ = ["as_key", "as_keys", "as_tuples", "as_view", "check_count"]

BufferOrAddress = Any  # a Python buffer (memoryview, bytearray, numpy array, ...) or an int


def as_keys(keys: Iterable[bytes | str], where: str) -> list[bytes]:
    """`as_key` of each key; `where` names the call in the error for a non-list."""
    if isinstance(keys, bytes | str):
        raise LocalProtocolError(f"{where}: pass a list of keys, not one key {keys[:40]!r}")
    try:
        return [as_key(k) for k in keys]
    except TypeError:
        raise LocalProtocolError(f"{where}: pass an iterable of keys (bytes or str)") from None


def as_key(key: bytes | str) -> bytes:
    """Encode a key (str as UTF-8) and enforce the 1..512-byte wire limit."""
    if isinstance(key, str):
        data = key.encode()
    elif isinstance(key, bytes | bytearray | memoryview):
        data = bytes(key)
    else:
        raise LocalProtocolError(f"invalid key of type {type(key).__name__!r}: use bytes or str")
    if not data:
        raise LocalProtocolError("empty key: keys must be 1..512 bytes")
    if len(data) > MAX_KEY_LEN:
        raise KeyTooLongError(
            f"key of {len(data)} bytes exceeds the {MAX_KEY_LEN}-byte wire limit "
            f"(hash long keys client-side): {data[:40]!r}..."
        )
    return data


def check_count(name: str, value: Any, where: str) -> int:
    """`value` if it is an `int` in `[0, 2**64)`; else `LocalProtocolError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise LocalProtocolError(f"{where}: invalid {name} {value!r}: use an int in [0, 2**64)")
    return value


def as_tuples(items: Any, arity: int, shape: str, where: str) -> list[tuple[Any, ...]]:
    """The items of a batch call as tuples of `arity` fields (`shape` names them);
    anything else raises `LocalProtocolError` instead of a bare TypeError."""
    try:
        out = [tuple(item) for item in items]
    except TypeError:
        raise LocalProtocolError(f"{where}: pass an iterable of {shape} tuples") from None
    for item in out:
        if len(item) != arity:
            raise LocalProtocolError(
                f"{where}: item {item!r:.80} has {len(item)} fields; expected {shape}"
            )
    return out


def as_view(buf: BufferOrAddress, length: int, *, writable: bool) -> memoryview:
    """A byte memoryview of exactly `length` bytes over `buf`.

    `buf` is either an object exporting a C-contiguous buffer of at least `length`
    bytes, or an `int` address of host memory that the caller keeps alive (and
    writable, for reads) for the duration of the call.
    """
    check_count("length", length, "buffer")
    if isinstance(buf, int) and not isinstance(buf, bool):
        if not 0 < buf < 1 << 64 or buf + length > 1 << 64:
            raise LocalProtocolError(f"invalid address {buf:#x} (length {length})")
        if length == 0:
            return memoryview(b"") if not writable else memoryview(bytearray())
        return memoryview((ctypes.c_char * length).from_address(buf)).cast("B")
    try:
        view = memoryview(buf)
    except TypeError:
        raise LocalProtocolError(
            f"invalid buffer of type {type(buf).__name__!r}: "
            "pass a buffer (memoryview, bytearray, numpy array) or an int address"
        ) from None
    if not view.c_contiguous:
        raise LocalProtocolError("buffer is not C-contiguous")
    if writable and view.readonly:
        raise LocalProtocolError("buffer is read-only; batch_get_into needs a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if view.nbytes < length:
        raise LocalProtocolError(f"buffer holds {view.nbytes} bytes, fewer than length {length}")
    return view[:length]
