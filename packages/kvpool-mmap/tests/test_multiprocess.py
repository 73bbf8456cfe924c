"""The vLLM arrangement across real processes: each tp-rank worker creates and maps its own
L1 file first; the scheduler's store attaches afterwards and moves data L1<->L2; the
workers see, through their own mappings, exactly what the store promoted."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

from conftest import MakeConfig, block, key
from kvpool_mmap import LoadStatus, StoreConfig, Tier, TieredStore, open_l1_rank

TP = 2


def _worker(config: StoreConfig, rank: int, conn: Connection) -> None:
    l1 = open_l1_rank(config, rank, create=True)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "write":  # ("write", [(block id, slot), ...])
            for i, slot in msg[1]:
                l1.array[slot] = block(i, TP)[rank]
            conn.send("done")
        elif msg[0] == "read":  # ("read", [slot, ...]) -> bytes of each slot
            conn.send([l1.array[slot].tobytes() for slot in msg[1]])
        else:
            l1.close(unlink=True)
            conn.send("bye")
            return


def test_workers_create_scheduler_attaches(make_config: MakeConfig) -> None:
    cfg = make_config(l1_slots=4, l2_slots=32, tp_size=TP)
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for r in range(TP):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(cfg, r, child), daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    try:
        assert [c.recv() for c in pipes] == ["ready"] * TP
        store = TieredStore(cfg, create_l1=False)

        def store_ids(ids: list[int]) -> None:
            t = store.begin_store([key(i) for i in ids])
            pairs = [(i, s) for i, s in zip(ids, t.l1_slots, strict=True) if s is not None]
            for c in pipes:
                c.send(("write", pairs))
            assert [c.recv() for c in pipes] == ["done"] * TP
            store.commit_store(t)
            store._drain(10)

        store_ids([0, 1, 2, 3])
        store_ids([10, 11, 12, 13])  # evicts 0..3 from L1; they live on in L2
        assert store.lookup([key(i) for i in range(4)]) == [Tier.L2] * 4
        load = store.begin_load([key(i) for i in range(4)])
        assert store.wait_load(load, timeout=10) is LoadStatus.READY
        for r, c in enumerate(pipes):  # the workers read what the store promoted
            c.send(("read", load.l1_slots))
            got = c.recv()
            for i, raw in enumerate(got):
                assert raw == block(i, TP)[r].tobytes()
        store.end_load(load)
        store.close()
        for c in pipes:
            c.send(("stop",))
            assert c.recv() == "bye"
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert not any(cfg.l1_file(r).exists() for r in range(TP))


def test_l1_file_recreated_under_the_store_turns_the_cache_off(make_config: MakeConfig) -> None:
    cfg = make_config(l1_slots=4, l2_slots=16)
    worker = open_l1_rank(cfg, 0, create=True)
    store = TieredStore(cfg, create_l1=False)
    try:
        t = store.begin_store([key(1)])
        store.commit_store(t)
        assert store.lookup([key(1)]) == [Tier.L1]
        worker.close()
        worker = open_l1_rank(cfg, 0, create=True)  # a restarted worker makes a new file
        for _ in range(store.L1_CHECK_EVERY):
            store.tick()
        assert store.stats().disabled == 1
        assert store.lookup([key(1)]) == []  # never hand out slots the worker cannot see
        assert store.begin_store([key(2)]).l1_slots == [None]
        assert store.begin_load([key(1)]).keys == []
    finally:
        store.close(flush=False)
        worker.close(unlink=True)


def test_l1_name_removed_after_attach_keeps_the_cache_on(make_config: MakeConfig) -> None:
    # An anonymous pool: once the worker and the store have it mapped, its name is
    # removed so nothing is left behind; the shared memory stays and so must the cache.
    cfg = make_config(l1_slots=4, l2_slots=16)
    worker = open_l1_rank(cfg, 0, create=True)
    store = TieredStore(cfg, create_l1=False)
    try:
        cfg.l1_file(0).unlink()
        t = store.begin_store([key(1)])
        worker.array[t.l1_slots[0]] = 7
        store.commit_store(t)
        for _ in range(2 * store.L1_CHECK_EVERY):
            store.tick()
        assert store.stats().disabled == 0
        load = store.begin_load([key(1)])
        assert load.keys == [key(1)]
        assert (worker.array[load.l1_slots[0]] == 7).all()
        store.end_load(load)
    finally:
        store.close(flush=False)
        worker.close()
