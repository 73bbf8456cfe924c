"""The client driven exactly as the vendor's vLLM tier plugin drives the vendor client.

That plugin (see docs/memkv-protocol.md, "Vendor-usage contract") keeps a CPU pool of
fixed-size slots registered as one region, stores and loads slots by raw address in
chunks, reads each item's result as a hit flag (`flag == True`), deletes the keys of
failed loads, and calls `deregister_region(addr, length)` before freeing the pool.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import ServerProcess, make_client
from memkv_client import Client, MemKVError, ResultKind

SLOT = 16 << 10
SLOTS = 64
CHUNK = 8  # blocks_per_op


class VendorStylePool:
    """The plugin's CPU pool: one anonymous mapping, slot `i` at `base + i * SLOT`."""

    def __init__(self) -> None:
        self.map = mmap.mmap(-1, SLOT * SLOTS)
        anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(anchor)
        del anchor

    def addr(self, slot: int) -> int:
        return self.base + slot * SLOT

    def fill(self, slot: int, byte: int) -> None:
        self.map[slot * SLOT : (slot + 1) * SLOT] = bytes([byte]) * SLOT

    def read(self, slot: int) -> bytes:
        return self.map[slot * SLOT : (slot + 1) * SLOT]


def store_job(client: Client, keys: Sequence[str], slots: Sequence[int], pool: Any) -> list[bool]:
    flags: list[bool] = []
    for start in range(0, len(keys), CHUNK):
        part = zip(keys[start : start + CHUNK], slots[start : start + CHUNK], strict=True)
        items = [(k, pool.addr(s), SLOT) for k, s in part]
        flags += [r == True for r in client.batch_put_views(items)]  # noqa: E712 (the contract)
    return flags


def load_job(client: Client, keys: Sequence[str], slots: Sequence[int], pool: Any) -> list[bool]:
    flags: list[bool] = []
    for start in range(0, len(keys), CHUNK):
        part = list(zip(keys[start : start + CHUNK], slots[start : start + CHUNK], strict=True))
        results = client.batch_get_into([(k, pool.addr(s), SLOT) for k, s in part])
        for (key, _), result in zip(part, results, strict=True):
            hit = result == True  # noqa: E712 (the contract)
            if not hit:
                client.delete(key)  # the plugin deletes a failed key so lookups stop hitting
            flags.append(hit)
    return flags


def test_vendor_plugin_store_lookup_load_cycle(server: ServerProcess) -> None:
    pool = VendorStylePool()
    client = make_client(server.address)
    try:
        client.register_region(pool.base, SLOT * SLOTS)
        keys = [f"vendor/blk{i}" for i in range(20)]
        for i in range(20):
            pool.fill(i, i + 1)
        assert store_job(client, keys, list(range(20)), pool) == [True] * 20
        assert client.exists(keys) == [True] * 20
        client.delete(keys[3])  # evicted meanwhile
        loaded = load_job(client, keys, list(range(32, 52)), pool)
        assert loaded == [i != 3 for i in range(20)]
        assert all(pool.read(32 + i) == bytes([i + 1]) * SLOT for i in range(20) if i != 3)
        assert client.exists(keys[3:4]) == [False]
        client.deregister_region(pool.base, SLOT * SLOTS)
    finally:
        client.close()


def test_results_keep_the_detail_and_compare_as_flags(client: Client) -> None:
    buf = bytearray(8)
    (ok,) = client.batch_put_views([("vendor/x", b"12345678", 8)])
    (miss,) = client.batch_get_into([("vendor/absent", buf, 8)])
    (short,) = client.batch_get_into([("vendor/x", buf, 4)])
    assert (ok == True, ok.kind, ok.ok) == (True, ResultKind.OK, True)  # noqa: E712
    assert (miss == False, miss.kind) == (True, ResultKind.MISS)  # noqa: E712
    stored_8 = "stored value has 8 bytes"
    assert (short == False, short.kind, short.cause) == (True, ResultKind.MISS, stored_8)  # noqa: E712
    assert [bool(r) for r in (ok, miss, short)] == [True, False, False]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.exists(None),
        lambda c: c.exists_on(0, 5),
        lambda c: c.batch_put_views([(b"k", b"v")]),
        lambda c: c.batch_put_views(5),
        lambda c: c.batch_put_views([(b"k", b"v", "1")]),
        lambda c: c.batch_put_views([(b"k", 1 << 70, 1)]),
        lambda c: c.batch_get_into([(b"k", bytearray(1))]),
        lambda c: c.batch_xfer([(b"k", 1, 2)], True),
        lambda c: c.register_region("x", 1),
        lambda c: c.deregister_region(1, -2),
    ],
)
def test_bad_client_input_raises_memkv_errors(client: Client, call: Any) -> None:
    with pytest.raises(MemKVError):
        call(client)
