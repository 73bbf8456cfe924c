"""Start, query and stop a real vLLM OpenAI server on 127.0.0.1 (used by the demo and tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_ports import free_port

ERROR_LINE = re.compile(r"\bERROR\b|Error\b|Traceback|\berror:")


def first_error(log: str) -> str:
    """The first line of a server log that reports an error (warnings that mention one
    aside), or ""."""
    for line in log.splitlines():
        if ERROR_LINE.search(line) and "WARNING" not in line and "Warning" not in line:
            return line
    return ""


@dataclass
class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` process."""

    model: str
    log_path: Path
    kv_transfer_config: dict[str, Any] | None = None
    kv_cache_memory_bytes: int = 16 << 20
    max_model_len: int = 4096
    dtype: str = "bfloat16"
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    """More `vllm serve` flags (e.g. `--kv-events-config`)."""
    engine_flags: list[str] | None = None
    """Engine flags in place of the CPU defaults (`--dtype`, `--enforce-eager`, `--block-size`,
    `--kv-cache-memory-bytes`, `--max-model-len`, `--enable-prefix-caching`, `--max-num-seqs`)."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 600) -> VllmServer:
        """Launch and wait until /health answers; a process that exits fails at once, a
        slow start (a busy machine compiles and profiles for minutes) only after `timeout`."""
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        cmd += self.engine_flags if self.engine_flags is not None else [
            "--dtype", self.dtype, "--enforce-eager", "--block-size", "32",
            "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
            "--max-model-len", str(self.max_model_len), "--enable-prefix-caching", "--max-num-seqs", "8",
        ]  # fmt: skip
        if self.kv_transfer_config:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
        cmd += self.extra_args
        env = {**os.environ, **self.env}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited early; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {timeout}s; see {self.log_path}")

    def refused(self, timeout: float = 120) -> tuple[str, float]:
        """Start a server that must stop during start-up (a bad setting): its log and the
        seconds it ran; AssertionError if it became healthy or outlived `timeout`."""
        started = time.monotonic()
        try:
            self.start(timeout=timeout)
        except RuntimeError:
            return self.log_path.read_text(), time.monotonic() - started
        except TimeoutError:
            pass
        finally:
            self.stop()
        raise AssertionError(f"the server did not stop during start-up; see {self.log_path}")

    def stop(self, timeout: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def complete(self, prompt: list[int], max_tokens: int = 8) -> tuple[list[int], float]:
        """Greedy completion of token ids; returns (token ids, time to first token in s)."""
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "return_token_ids": True,
        }  # fmt: skip
        request = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        ttft = None
        tokens: list[int] = []
        with urllib.request.urlopen(request, timeout=300) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if ttft is None:
                    ttft = time.perf_counter() - start
                choice = json.loads(line[6:])["choices"][0]
                tokens += choice.get("token_ids") or []
        return tokens, ttft if ttft is not None else time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as {'name{labels}': value}."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+([-+\deE.naif]+)$", line)
            if match:
                samples[match.group(1)] = float(match.group(2))
        return samples


def metric_sum(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total
