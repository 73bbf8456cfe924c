"""The `memkv` command line: a bad value of any flag is one line naming the flag, the
value and the accepted form (exit 2); the startup line tells the truth; a created auth
key is announced once."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServerProcess, make_client
from memkv_client.auth import user_key
from memkv_client.cli import main

BAD_FLAGS = [
    # (argv, the accepted form the message must show)
    (["serve", "--listen", "nonsense"], "host:port"),
    (["serve", "--listen", "127.0.0.1:99999"], "1..65535"),
    (["serve", "--memory", "lots"], "GiB"),
    (["serve", "--memory", "512KiB"], "1024KiB"),  # too small for the 4 default lanes
    (["serve", "--lanes", "0"], "1..1024"),
    (["serve", "--lanes", "four"], "1..1024"),
    (["serve", "--dir-capacity", "1XB"], "GiB"),
    (["serve", "--replay-window-ms", "0"], ">= 1"),
    (["serve", "--max-connections", "many"], ">= 1"),
    (["serve", "--frame-timeout-s", "-1"], "seconds in (0, 86400]"),
    (["serve", "--frame-timeout-s", "nan"], "seconds in (0, 86400]"),
    (["serve", "--idle-timeout-s", "inf"], "seconds in (0, 86400]"),
    (["serve", "--exists-lease-ms", "-5"], ">= 0"),
    (["serve", "--rdma", "maybe"], "'auto', 'on', 'off'"),
    (["serve", "--listen", "127.0.0.1:0", "--dir", "/proc/no-such-dir"], "No such file"),
    (["stats", "--server", "127.0.0.1"], "host:port"),
]


@pytest.mark.parametrize(("argv", "accepted"), BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_a_bad_flag_value_is_one_line_and_exit_2(
    argv: list[str], accepted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, value = argv[-2], argv[-1]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert flag in err
    assert value in err
    assert accepted in err


def test_bad_flags_leave_no_traceback_in_a_real_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "memkv_client.cli", "serve", "--lanes", "x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == "memkv serve: argument --lanes: 'x' is not an integer in 1..1024\n"


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_the_startup_line_reports_the_rdma_mode_in_force(mode: str) -> None:
    srv = ServerProcess("--memory", "4MiB", "--rdma", mode).start()
    try:
        with make_client(srv.address) as c:
            serving = c.stats()["rdma"]
    finally:
        srv.stop()
    (line,) = [ln for ln in srv.output[-1].splitlines() if "listening on" in ln]
    print(line)
    assert ("rdma=on" in line) is serving
    assert ("rdma=off" in line) is not serving
    if mode == "off":
        assert "rdma=off (--rdma off)" in line


def test_a_created_auth_key_is_announced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loopback server without MEMKV_AUTH_KEY creates the user's key file: one line
    says where and how to share it; the next start, which finds the file, says nothing."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # ServerProcess drops MEMKV_*
    key_file = tmp_path / "memkv" / "auth.key"
    outputs = []
    for _ in range(2):
        srv = ServerProcess("--memory", "4MiB", key_hex="").start()
        srv.stop()
        outputs.append(srv.output[-1])  # the whole log, read after the server stopped
    announced = [ln for ln in outputs[0].splitlines() if "created the auth key" in ln]
    print(announced)
    assert len(announced) == 1
    assert str(key_file) in announced[0]
    assert "MEMKV_AUTH_KEY" in announced[0]
    assert "created the auth key" not in outputs[1]
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_the_client_announces_a_key_it_creates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memkv_client")
    path = tmp_path / "memkv" / "auth.key"
    assert user_key(path) == user_key(path)
    (record,) = caplog.records
    assert str(path) in record.getMessage()
    assert "MEMKV_AUTH_KEY" in record.getMessage()
