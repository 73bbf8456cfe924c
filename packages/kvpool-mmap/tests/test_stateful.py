"""Hypothesis state machine: random stores, loads, cancels, restarts and corruptions.

Whatever the sequence, every block a load reports as ready holds exactly the bytes stored
for its key, the index invariants hold after every step, and checksum failures happen
only after a byte was corrupted on disk.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from conftest import block, key
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kvpool_mmap import HEADER_BYTES, LoadStatus, LoadTicket, StoreConfig, TierConfig, TieredStore
from kvpool_mmap._index import SlotState
from test_store import check_invariants

TP = 2
STRIDE = 4096


class StoreMachine(RuleBasedStateMachine):
    L1_OVERFLOW = "demote"

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="kvpool-hyp-"))
        self.config = StoreConfig(
            stride=STRIDE,
            engine_id="hyp",
            fingerprint=b"hyp",
            l1=TierConfig(self.root / "l1", 5 * STRIDE * TP),
            l2=TierConfig(self.root / "l2", 12 * (STRIDE + HEADER_BYTES) * TP),
            tp_size=TP,
            io_threads=2,
            write_through_queue=3,
            l1_overflow=self.L1_OVERFLOW,
        )
        self.store = TieredStore(self.config)
        self.tickets: list[LoadTicket] = []
        self.corrupted = False
        self.corrupted_keys: list[bytes] = []

    @rule(start=st.integers(0, 30), n=st.integers(1, 4))
    def store_chain(self, start: int, n: int) -> None:
        ids = list(range(start, start + n))
        self.store.put([key(i) for i in ids], np.stack([block(i, TP) for i in ids]))

    @rule(start=st.integers(0, 30), n=st.integers(1, 4))
    def begin_load(self, start: int, n: int) -> None:
        self.tickets.append(self.store.begin_load([key(i) for i in range(start, start + n)]))

    @precondition(lambda self: self.tickets)
    @rule(data=st.data())
    def finish_load(self, data: st.DataObject) -> None:
        self.finish(self.tickets[data.draw(st.integers(0, len(self.tickets) - 1))])

    @precondition(lambda self: self.tickets)
    @rule()
    def cancel_load(self) -> None:
        self.store.end_load(self.tickets.pop())

    @rule()
    def tick(self) -> None:
        self.store.tick()

    @rule()
    def settle(self) -> None:
        self.store._drain(10)

    @rule(flush=st.booleans())
    def restart(self, flush: bool) -> None:
        for t in self.tickets:
            self.store.end_load(t)
        self.tickets.clear()
        self.store.close(flush=flush)
        self.store = TieredStore(self.config)
        assert self.store.recovery.corrupt_headers == 0

    # draws must not depend on I/O timing (hypothesis replays them): fixed ranges, modulo
    @rule(pick=st.integers(0, 1 << 16), rank=st.integers(0, TP - 1), at=st.integers(0, STRIDE - 1))
    def corrupt_l2(self, pick: int, rank: int, at: int) -> None:
        self.store._drain(10)
        live = sorted(  # L2-only copies, so that a load must read the corrupted bytes
            (
                e
                for e in self.store._entries.values()
                if e.l2_state == SlotState.VALID and e.l2_pins == 0 and e.l1_state == SlotState.NONE
            ),
            key=lambda e: e.key,
        )
        if not live:
            return
        e = live[pick % len(live)]
        f = self.store.l2_files[rank]
        off = f.payload_offset(e.l2) + at
        with open(f.path, "r+b") as fh:
            fh.seek(off)
            b = fh.read(1)
            fh.seek(off)
            fh.write(bytes([b[0] ^ 0x5A]))
        self.corrupted = True
        self.corrupted_keys.append(e.key)

    @precondition(lambda self: self.corrupted_keys)
    @rule()
    def load_corrupted(self) -> None:
        k = self.corrupted_keys.pop()
        t = self.store.begin_load([k])
        self.tickets.append(t)
        self.finish(t)

    def finish(self, t: LoadTicket) -> None:
        self.tickets.remove(t)
        status = self.store.wait_load(t, timeout=10)
        assert status is not LoadStatus.PENDING
        for k, slot in zip(t.keys, t.l1_slots, strict=True):
            if k in t.failed:
                continue
            i = int.from_bytes(k[:32], "big")
            for r in range(TP):
                np.testing.assert_array_equal(self.store.l1_files[r].array[slot], block(i, TP)[r])
        self.store.end_load(t)

    @invariant()
    def consistent(self) -> None:
        check_invariants(self.store)
        if not self.corrupted:
            assert self.store.stats().checksum_failures == 0

    def teardown(self) -> None:
        for t in self.tickets:
            self.store.end_load(t)
        self.store.close(flush=False)
        shutil.rmtree(self.root, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=40, deadline=None, database=None
)
TestStoreMachine = StoreMachine.TestCase


class DropUnwrittenMachine(StoreMachine):
    """The same under `drop_unwritten`, where stores also re-fill L1 from keys only in L2."""

    L1_OVERFLOW = "drop_unwritten"


DropUnwrittenMachine.TestCase.settings = StoreMachine.TestCase.settings
TestDropUnwrittenMachine = DropUnwrittenMachine.TestCase
