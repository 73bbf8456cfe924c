"""One server per spill directory, and spill files that vanish anyway: real `memkv serve`
processes on 127.0.0.1, each with a 4 MiB memory so a few 1 MiB values spill."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KEY_HEX, ServerProcess, free_port, make_client, wait_until
from memkv_client import ResultKind

MiB = 1 << 20
VALUES = 10  # 1 MiB each into 4 MiB of memory: at least 6 spill


@pytest.fixture
def spilling(tmp_path: Path) -> Iterator[tuple[ServerProcess, list[bytes]]]:
    """A server with `--dir tmp_path/spill` holding VALUES values, most of them spilled."""
    srv = ServerProcess("--memory", "4MiB", "--lanes", "1", "--dir", str(tmp_path / "spill"))
    srv.start()
    values = [os.urandom(MiB) for _ in range(VALUES)]
    with make_client(srv.address, num_connections=1) as c:
        for i, v in enumerate(values):  # one at a time: LRU order is insertion order
            c.put(f"sp/{i}", v)
        spilled = c.stats()["store"]["spill"]["items"]
    assert spilled >= 6
    assert wait_until(lambda: len(list((tmp_path / "spill").glob("*.mkv"))) == spilled)
    yield srv, values
    srv.stop()


def test_a_second_server_on_the_same_dir_exits_at_once(
    spilling: tuple[ServerProcess, list[bytes]], tmp_path: Path
) -> None:
    srv, values = spilling
    assert srv.proc is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMKV_")}
    env["MEMKV_AUTH_KEY"] = KEY_HEX
    spill = tmp_path / "spill"
    second = subprocess.run(
        [sys.executable, "-m", "memkv_client.server", "--listen", f"127.0.0.1:{free_port()}",
         "--memory", "4MiB", "--no-prefault", "--dir", str(spill)],
        capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    print(f"second server: exit {second.returncode}: {second.stderr.strip()}")
    assert second.returncode != 0
    assert "listening on" not in second.stdout
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert str(spill) in lines[0]
    assert f"pid {srv.proc.pid}" in lines[0]
    with make_client(srv.address) as c:  # the first server's spilled values are intact
        outs = [bytearray(MiB) for _ in values]
        results = c.batch_get_into([(f"sp/{i}", o, MiB) for i, o in enumerate(outs)])
        assert [r.kind for r in results] == [ResultKind.OK] * VALUES
        assert [bytes(o) for o in outs] == values


def test_a_vanished_spill_file_is_a_miss(
    spilling: tuple[ServerProcess, list[bytes]], tmp_path: Path
) -> None:
    """Spill files removed behind the server's back: `exists` says no, GET answers a
    miss on the same connection, and the values still in memory are served."""
    srv, values = spilling
    for f in (tmp_path / "spill").glob("*.mkv"):
        f.unlink()
    keys = [f"sp/{i}" for i in range(VALUES)]
    with make_client(srv.address, num_connections=1) as c:
        present = c.exists(keys)
        outs = [bytearray(MiB) for _ in values]
        results = c.batch_get_into([(k, o, MiB) for k, o in zip(keys, outs, strict=True)])
        stats = c.stats()
    kinds = [r.kind for r in results]
    print(f"after removing the spill files: exists {present}, GET {[k.value for k in kinds]}")
    assert set(kinds) == {ResultKind.OK, ResultKind.MISS}, kinds
    assert present == [k is ResultKind.OK for k in kinds]
    for kind, out, value in zip(kinds, outs, values, strict=True):
        if kind is ResultKind.OK:
            assert bytes(out) == value
    assert stats["store"]["spill"]["items"] == 0
    assert stats["store"]["counters"]["spill_lost"] == kinds.count(ResultKind.MISS)
