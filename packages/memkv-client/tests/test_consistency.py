"""End to end through a real server: concurrent overwrites and eviction never yield
partial or mixed values, only whole values or misses."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from conftest import ServerProcess, make_client
from memkv_client import ResultKind

SIZE = 600_000  # > 64 KiB: lives in arena blocks
KEYS = [f"mix/{i}" for i in range(3)]


@pytest.fixture
def small_server() -> Iterator[ServerProcess]:
    # 4 MiB, one lane: about six values fit, so the writers below force evictions too
    srv = ServerProcess("--memory", "4MiB", "--lanes", "1").start()
    yield srv
    srv.stop()


def test_overwrites_and_evictions_never_mix(small_server: ServerProcess) -> None:
    errors: list[str] = []
    seen = {"ok": 0, "miss": 0}
    lock = threading.Lock()

    def writer(w: int) -> None:
        with make_client(small_server.address, num_connections=1) as c:
            for version in range(1, 41):
                tag = (w * 50 + version) % 255 + 1
                value = bytes([tag]) * SIZE
                # also churn other keys so that eviction runs concurrently
                items = [(k, value, SIZE) for k in KEYS] + [(f"churn/{w}/{version}", value, SIZE)]
                for r in c.batch_put_views(items):
                    if r.kind is not ResultKind.OK and "NO_SPACE" not in r.cause:
                        errors.append(f"put: {r}")

    def reader() -> None:
        buf = bytearray(SIZE)
        with make_client(small_server.address, num_connections=1) as c:
            for i in range(120):
                key = KEYS[i % len(KEYS)]
                (r,) = c.batch_get_into([(key, buf, SIZE)])
                if r.kind is ResultKind.OK:
                    first = buf[0]
                    if first == 0 or buf.count(first) != SIZE:
                        errors.append(f"mixed or partial value under {key}")
                    with lock:
                        seen["ok"] += 1
                elif r.kind is ResultKind.MISS:
                    with lock:
                        seen["miss"] += 1
                else:
                    errors.append(f"get: {r}")
                buf[:] = bytes(SIZE)  # a later miss must not leave old data looking valid

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    assert seen["ok"] > 0
    with make_client(small_server.address) as c:
        assert c.stats()["store"]["lanes"][0]["evictions"] > 0  # eviction really ran
