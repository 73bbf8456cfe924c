"""The server as a process: SIGTERM, `memkv stats`, `memkv net topo`, spilling, arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import KEY_HEX, ServerProcess, make_client, wait_until


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MEMKV_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "memkv_client.cli", *args],
        capture_output=True, text=True, timeout=60, env=full,
    )  # fmt: skip


def test_sigterm_is_graceful(fresh_server: ServerProcess) -> None:
    with make_client(fresh_server.address) as c:
        c.put("t/a", b"x")  # leaves an idle pooled connection open
        assert fresh_server.terminate() == 0
    assert "memkv: stopped" in "".join(fresh_server.output)


def test_memkv_stats_against_live_server(server: ServerProcess) -> None:
    with make_client(server.address) as c:
        c.put("stats/a", b"12345")
    out = _run("stats", "--server", server.address, env={"MEMKV_AUTH_KEY": KEY_HEX})
    assert out.returncode == 0, out.stderr
    assert server.address in out.stdout
    assert "lane 0:" in out.stdout
    js = _run("stats", "--json", env={"MEMKV_AUTH_KEY": KEY_HEX, "MEMKV_SERVERS": server.address})
    assert js.returncode == 0, js.stderr
    assert '"items"' in js.stdout
    bad = _run("stats", "--server", server.address, env={"MEMKV_AUTH_KEY": "33" * 32})
    assert bad.returncode == 1
    assert "BAD_MAC" in bad.stderr


def test_memkv_net_topo_without_hardware() -> None:
    out = _run("net", "topo")
    assert out.returncode == 0
    if not Path("/sys/class/infiniband").exists():
        assert "no" in out.stdout
        assert "found" in out.stdout


def test_bad_arguments_exit_2() -> None:
    out = _run("serve", "--listen", "127.0.0.1:0", "--memory", "lots")
    assert out.returncode == 2
    assert "not a size" in out.stderr
    out = _run("serve", "--listen", "nonsense", "--memory", "1MiB")
    assert out.returncode == 2
    assert "host:port" in out.stderr


def test_spill_directory(tmp_path: Path) -> None:
    srv = ServerProcess("--memory", "4MiB", "--lanes", "1", "--dir", str(tmp_path)).start()
    try:
        values = [os.urandom(1 << 20) for _ in range(10)]
        with make_client(srv.address, num_connections=1) as c:
            for i, v in enumerate(values):  # one at a time: LRU order is insertion order
                c.put(f"sp/{i}", v)
            st = c.stats()["store"]
            assert st["spill"]["items"] >= 6
            files = lambda: len(list(tmp_path.glob("*.mkv")))  # noqa: E731
            assert wait_until(lambda: files() == st["spill"]["items"])  # unlinks are async
            assert c.exists([f"sp/{i}" for i in range(10)]) == [True] * 10
            outs = [bytearray(1 << 20) for _ in values]
            assert all(c.batch_get_into([(f"sp/{i}", o, len(o)) for i, o in enumerate(outs)]))
            assert [bytes(o) for o in outs] == values
            assert c.delete("sp/0")
            assert c.get("sp/0") is None
    finally:
        assert srv.terminate() == 0
    assert list(tmp_path.glob("*.mkv")) == []


def test_cli_version_and_serve_help_show_what_users_need() -> None:
    version = _run("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("memkv ")
    helptext = _run("serve", "--help").stdout
    for shown in ("(default: 4GiB)", "(default: 127.0.0.1:9900)", "(default: 10.0)"):
        assert shown in " ".join(helptext.split()), shown


def test_stats_into_a_closed_pipe_exits_quietly(server: ServerProcess) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMKV_")}
    env["MEMKV_AUTH_KEY"] = KEY_HEX
    proc = subprocess.Popen(
        [sys.executable, "-m", "memkv_client.cli", "stats", "--json", "--server", server.address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head` that has already exited
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err
    assert b"BrokenPipe" not in err
