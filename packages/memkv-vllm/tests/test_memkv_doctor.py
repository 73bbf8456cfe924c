"""`python -m memkv_vllm doctor` against real members: a `memkv serve` with the right and a
wrong auth key, a closed port, a real `mooncake_master` (its RPC port and its HTTP
metadata server), and the command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_fixtures import install_vllm_metadata  # tools/, on the path (conftest.py)
from local_ports import free_port
from memkv_server import MemKVServer
from memkv_vllm.doctor import doctor_checks
from mooncake_cluster import MooncakeCluster, mooncake_master_binary
from vllm_kv_identity.doctor import Check, Status

DIRECT = {"spec_name": "MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec"}
WRONG_KEY = "ab" * 32


@pytest.fixture(autouse=True)
def _clean_memkv_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MEMKV_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MEMKV_TRANSPORT", "tcp")


def _only(checks: list[Check], start: str) -> Check:
    found = [c for c in checks if c.finding.startswith(start)]
    assert len(found) == 1, "\n".join(c.finding for c in checks)
    return found[0]


def test_memkv_server_with_our_key(memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMKV_SERVERS", memkv.address)
    checks = doctor_checks(DIRECT)
    assert _only(checks, "configuration: ").finding == "configuration: valid; direct mode (memkv)"
    server = _only(checks, f"MemKV server {memkv.address}")
    assert server.status is Status.OK
    assert server.finding.endswith("answers and accepts our auth key")


def test_memkv_server_with_a_wrong_key(memkv: MemKVServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMKV_SERVERS", memkv.address)
    monkeypatch.setenv("MEMKV_AUTH_KEY", WRONG_KEY)
    server = _only(doctor_checks(DIRECT), f"MemKV server {memkv.address}")
    assert server.status is Status.FAIL
    assert "refuses our auth key (BAD_MAC" in server.finding
    assert server.fix.startswith("set the same MEMKV_AUTH_KEY for the server and every vLLM")


def test_memkv_server_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("MEMKV_SERVERS", address)
    server = _only(doctor_checks(None, timeout=1.0), f"MemKV server {address}")
    assert server.status is Status.FAIL
    assert "does not answer within 1 s" in server.finding
    assert server.fix.startswith(f"start `memkv serve --listen {address}` there")


def test_configuration_problems_stop_before_any_probe() -> None:
    bad = doctor_checks({**DIRECT, "memkv_num_threads": 0})
    assert bad[-1].status is Status.FAIL
    assert "memkv_num_threads" in bad[-1].finding
    other = doctor_checks({"spec_name": "CPUOffloadingSpec"})
    assert (
        other[-1].finding == "configuration: kv_connector_extra_config sets up no memkv-vllm store"
    )
    assert other[-1].status is Status.FAIL


@pytest.fixture
def mooncake_master(tmp_path: Path) -> Iterator[MooncakeCluster]:
    if mooncake_master_binary() is None:
        pytest.skip("mooncake_master is not installed (pip install 'memkv-vllm[mooncake]')")
    cluster = MooncakeCluster(tmp_path, stores=0)
    cluster.start()
    yield cluster
    cluster.stop()


def test_mooncake_master_and_metadata_server(
    mooncake_master: MooncakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    master, metadata = mooncake_master.master_address, mooncake_master.metadata_server
    monkeypatch.setenv("MEMKV_BACKEND", "mooncake")
    monkeypatch.setenv("MEMKV_MOONCAKE_MASTER", master)
    monkeypatch.setenv("MEMKV_MOONCAKE_METADATA_SERVER", metadata)
    checks = doctor_checks(None)
    assert _only(checks, f"Mooncake master {master}").status is Status.OK
    assert _only(checks, f"Mooncake metadata server {metadata}").status is Status.OK
    mooncake_master.stop()
    checks = doctor_checks(None, timeout=1.0)
    assert _only(checks, f"Mooncake master {master} is not reachable").status is Status.FAIL
    assert (
        _only(checks, f"Mooncake metadata server {metadata} does not answer").status is Status.FAIL
    )


def test_mooncake_metadata_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMKV_BACKEND", "mooncake")
    monkeypatch.setenv("MEMKV_MOONCAKE_MASTER", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("MEMKV_MOONCAKE_METADATA_SERVER", "P2PHANDSHAKE")
    assert _only(doctor_checks(None), "Mooncake metadata: P2PHANDSHAKE").status is Status.OK
    etcd = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("MEMKV_MOONCAKE_METADATA_SERVER", f"etcd://{etcd}")
    check = _only(doctor_checks(None, timeout=1.0), f"Mooncake metadata server (etcd) {etcd}")
    assert check.status is Status.FAIL
    assert check.fix.startswith("start etcd there")


def _doctor(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """`python -m memkv_vllm doctor --config FILE --kv-transfer-config ...` as a user runs
    it, with vLLM 0.32.0 installed."""
    site = install_vllm_metadata(tmp_path / "site", "0.32.0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMKV_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    transfer = '{"kv_connector": "MemKVOffloadingConnector", "kv_connector_extra_config": ' + (
        '{"spec_name": "MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec"}}'
    )
    cmd = [sys.executable, "-m", "memkv_vllm", "doctor", "--config", str(config),
           "--kv-transfer-config", transfer]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_command_with_a_config_file(tmp_path: Path, memkv: MemKVServer) -> None:
    config = tmp_path / "memkv.yaml"
    config.write_text(f"servers: ['{memkv.address}']\ntransport: tcp\n")
    done = _doctor(tmp_path, config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"✔ MemKV server {memkv.address} answers and accepts our auth key" in done.stdout
    assert done.stdout.splitlines()[-1].endswith("0 failure(s): a server can start")

    config.write_text(f"servers: ['{memkv.address}']\ntransport: tcp\nauth_key: '{WRONG_KEY}'\n")
    done = _doctor(tmp_path, config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"✖ MemKV server {memkv.address} refuses our auth key" in done.stdout
