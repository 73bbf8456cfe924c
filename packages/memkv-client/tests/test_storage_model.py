"""Randomised invariants of the server store (hypothesis state machine)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from memkv_client.protocol import Status
from memkv_client.server.storage import BLOCK_SIZE, Entry, Reservation, Store

KEYS = st.sampled_from([b"a/1", b"a/2", b"a/3", b"b/1", b"b/2", b"c", b"d/x", b"e/y"])
SIZES = st.sampled_from([0, 1, 100, 70_000, BLOCK_SIZE, BLOCK_SIZE + 1, 3 * BLOCK_SIZE])


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = Store(8 * BLOCK_SIZE, lanes=2, prefault=False, wait_timeout=0.0)
        self.last: dict[bytes, bytes] = {}  # the last value written per key
        self.pins: list[tuple[Entry, bytes]] = []
        self.counter = 0

    def _value(self, n: int) -> bytes:
        self.counter += 1
        return (self.counter.to_bytes(4, "little") * (n // 4 + 1))[:n]

    @rule(key=KEYS, n=SIZES)
    def put(self, key: bytes, n: int) -> None:
        value = self._value(n)
        res = self.store.reserve(key, n)
        if not isinstance(res, Reservation):
            assert res in (Status.NO_SPACE, Status.VALUE_TOO_LARGE)
            return
        pos = 0
        for v in res.views:
            v[:] = value[pos : pos + len(v)]
            pos += len(v)
        self.store.commit(res)
        self.last[key] = value

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        self.store.delete(key)
        self.last.pop(key, None)

    @rule(key=KEYS)
    def pin(self, key: bytes) -> None:
        e = self.store.pin(key)
        if e is not None:
            self.pins.append((e, self.last[key]))

    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        if self.pins:
            i = data.draw(st.integers(0, len(self.pins) - 1))
            e, expected = self.pins.pop(i)
            assert b"".join(bytes(v) for v in self.store.views(e)) == expected
            self.store.unpin(e)

    @invariant()
    def present_keys_hold_their_last_value(self) -> None:
        for key in self.last:
            e = self.store.pin(key)
            if e is None:
                continue  # evicted: a miss is always allowed
            try:
                assert b"".join(bytes(v) for v in self.store.views(e)) == self.last[key]
            finally:
                self.store.unpin(e)

    @invariant()
    def pinned_values_never_change(self) -> None:
        for e, expected in self.pins:
            assert b"".join(bytes(v) for v in self.store.views(e)) == expected

    @invariant()
    def accounting(self) -> None:
        st_ = self.store.stats()
        assert 0 <= st_["used"] <= st_["capacity"]
        assert sum(ln["used"] for ln in st_["lanes"]) == st_["used"]
        arena = self.store.arena
        blocks_used = arena.nblocks - st_["free_blocks"] - len(arena.lent)
        assert blocks_used * BLOCK_SIZE <= st_["used"]
        # the memory bound: blocks that may be resident plus bytes outside the arena
        resident = (arena.nblocks - len(arena.lent)) * BLOCK_SIZE + st_["outside_arena"]
        assert resident <= st_["capacity"]

    def teardown(self) -> None:
        for e, _ in self.pins:
            self.store.unpin(e)
        assert self.store.stats()["used"] == sum(ln["used"] for ln in self.store.stats()["lanes"])


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
