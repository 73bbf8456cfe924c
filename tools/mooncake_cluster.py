"""A real Mooncake Store cluster on 127.0.0.1 for tests, the benchmark and the demo.

`mooncake_master` (with its embedded HTTP metadata server) plus store processes
(`mooncake_segment.py` beside this file) that mount memory segments; every port is a free
ephemeral one and every endpoint is advertised on loopback (`MC_TCP_BIND_ADDRESS`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from local_ports import free_port, wait_listening

SEGMENT_DRIVER = Path(__file__).resolve().parent / "mooncake_segment.py"


def mooncake_master_binary() -> str | None:
    """`mooncake_master` next to this Python, or on PATH; None if Mooncake is missing."""
    beside = Path(sys.executable).parent / "mooncake_master"
    return str(beside) if beside.exists() else shutil.which("mooncake_master")


@dataclass
class MooncakeCluster:
    """`mooncake_master` + `stores` segment processes of `segment_mb` MiB each."""

    folder: Path
    stores: int = 3
    segment_mb: int = 64
    lease_ms: int = 1000  # --default_kv_lease_ttl: a read blocks removal/eviction this long
    client_ttl_s: int = 2  # --client_ttl: a silent store process is unmounted after this
    rpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    master: subprocess.Popen[bytes] | None = None
    segments: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _starts: int = 0

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def start(self) -> MooncakeCluster:
        try:
            self.start_master()
            for _ in range(self.stores):
                self.add_store()
        except BaseException:
            self.stop()  # leave no master or store process behind
            raise
        return self

    def start_master(self) -> None:
        binary = mooncake_master_binary()
        if binary is None:
            raise RuntimeError("mooncake_master not found: pip install 'memkv-vllm[mooncake]'")
        self._starts += 1
        log = self.folder / f"mooncake_master-{self._starts}.log"
        cmd = [binary, f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
               "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
               f"--http_metadata_server_port={self.http_port}", "--metrics_host=127.0.0.1",
               f"--metrics_port={self.metrics_port}", f"--default_kv_lease_ttl={self.lease_ms}",
               f"--client_ttl={self.client_ttl_s}", "--rpc_thread_num=2"]  # fmt: skip
        self.master = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        wait_listening(self.rpc_port, self.master, "mooncake_master", log)
        wait_listening(self.http_port, self.master, "mooncake_master", log)

    def add_store(self, segment_mb: int | None = None) -> subprocess.Popen[bytes]:
        """Start one more store process and wait until its segment is mounted."""
        log = self.folder / f"mooncake_store{len(self.segments)}.log"
        mb = str(segment_mb or self.segment_mb)
        proc = subprocess.Popen(
            [sys.executable, str(SEGMENT_DRIVER), self.master_address, self.metadata_server, mb],
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if line != "READY":
            proc.kill()
            raise RuntimeError(f"store process did not mount its segment ({line!r}); see {log}")
        self.segments.append(proc)
        return proc

    def kill_store(self, index: int) -> None:
        """SIGKILL one store process (a crashed host: its segment's values are gone)."""
        proc = self.segments[index]
        proc.kill()
        proc.wait()

    def restart_master(self) -> None:
        """SIGKILL the master and start it again on the same ports (no HA: it forgets
        every object; the store processes re-mount their segments by themselves)."""
        assert self.master is not None
        self.master.kill()
        self.master.wait()
        self.start_master()

    def remove_unleased(self) -> int:
        """Remove every value no lease protects (what eviction may take); the count."""
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        from mooncake.store import MooncakeDistributedStore

        client = MooncakeDistributedStore()
        rc = client.setup("127.0.0.1", self.metadata_server, 0, 16 << 20, "tcp", "",
                          self.master_address)  # fmt: skip
        assert rc == 0, rc
        try:
            return int(client.remove_all(False))
        finally:
            client.close()

    def env(self) -> dict[str, str]:
        """What a vLLM engine (or any memkv-vllm process) needs to use this cluster."""
        return {
            "MEMKV_BACKEND": "mooncake",
            "MEMKV_MOONCAKE_MASTER": self.master_address,
            "MEMKV_MOONCAKE_METADATA_SERVER": self.metadata_server,
            "MEMKV_MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
            "MC_TCP_BIND_ADDRESS": "127.0.0.1",
        }

    def stop(self) -> None:
        for proc in [*self.segments, self.master]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in [*self.segments, self.master]:
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
