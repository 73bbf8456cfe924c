"""`MooncakeStore`: the store interface over Mooncake Store (`mooncake.store`).

Mooncake's client has no per-call deadline and cannot cancel a call, so every call runs
under a `.guard.MemberGuard` (the stall budget; a missed deadline skips the backend until
a probe of the master answers). Batches move through this store's own registered
staging buffers (`batch_put_from` / `batch_get_into` by address, one memory copy on our
side): a call that missed its deadline may still run inside Mooncake's transfer engine
later, and it must never read or write memory the caller has reused by then. Small
records go through Mooncake's copying `put` / `get`.

Mooncake keys are strings: printable ASCII keys (the tier's names) are used as they are,
binary keys (the direct mode's) as `mkvh:<hex>`. Mooncake values are immutable (a put of
a present key keeps the old value) and a read takes a lease that blocks removal for
`--default_kv_lease_ttl`; both are harmless for content-addressed KV blocks.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..rdma_nic import rank_nic
from .guard import MemberGuard, MemberUnavailableError
from .protocol import Item, ItemOutcome, MemberState, StoreCounters

if TYPE_CHECKING:
    from .settings import StoreConfig

__all__ = ["MooncakeStore", "mooncake_key"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers

SETUP_DEADLINE_S = 30.0  # connecting to the master at startup (retries included)
PROBE_KEY = "memkv-vllm/probe"
PROTOCOLS = ("tcp", "rdma")
METADATA_SCHEMES = ("http://", "etcd://", "redis://", "P2PHANDSHAKE")

# Mooncake Store's ErrorCode values that explain a failed item (mooncake-store types.h)
_CAUSES = {
    -200: "no space (every segment full of leased or pinned values)",
    -101: "no segment mounted",
    -600: "invalid parameters (buffer size differs from the stored value)",
    -704: "not found",
    -706: "under lease",
    -707: "lease expired before the transfer finished",
    -712: "replica gone (its segment was unmounted)",
    -800: "transfer failed (the segment's host did not answer)",
    -900: "master RPC failed (is mooncake_master running?)",
    -901: "master RPC timed out",
}


def mooncake_key(key: bytes) -> str:
    """The Mooncake key of one of our keys (printable ASCII as is, else `mkvh:<hex>`)."""
    if key.isascii():
        text = key.decode("ascii")
        if text.isprintable() and not text.startswith("mkvh:"):
            return text
    return "mkvh:" + key.hex()


def _cause(code: int) -> str:
    return _CAUSES.get(code, f"Mooncake error {code}")


def _rdma_devices(config: StoreConfig, gpu: int | None) -> str:
    if config.mooncake_protocol != "rdma" or config.mooncake_rdma_devices:
        return config.mooncake_rdma_devices
    return rank_nic(gpu) or ""  # "": Mooncake discovers the devices itself


class _Staging:
    """Registered buffers lent to one call each; reused once the call is over."""

    MIN_BYTES = 1 << 20

    def __init__(self, register: Any) -> None:
        self._register = register
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self.buffers: list[np.ndarray] = []

    def acquire(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.nbytes >= nbytes:
                    return self._free.pop(i)
        size = max(self.MIN_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        buf = np.empty(size, dtype=np.uint8)
        rc = self._register(int(buf.ctypes.data), size)
        if rc != 0:
            raise RuntimeError(f"Mooncake register_buffer({size} bytes) failed ({rc})")
        with self._lock:
            self.buffers.append(buf)
        return buf

    def release(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.append(buf)


class MooncakeStore:
    """The store interface over `MooncakeDistributedStore` (see `.protocol.KVStore`).

    `gpu` is this rank's GPU (for the RDMA NIC choice), None in the scheduler. Raises
    `RuntimeError` when Mooncake is not installed or its setup fails (naming the key).
    """

    backend = "mooncake"
    settings_hint = (
        "Mooncake Store is set by mooncake_master and mooncake_metadata_server "
        "(MEMKV_MOONCAKE_MASTER, MEMKV_MOONCAKE_METADATA_SERVER)"
    )

    @classmethod
    def check_config(cls, config: StoreConfig, where: str, key_prefix: str) -> None:
        """Raise `ConfigError` for a bad `mooncake_*` value (before anything connects)."""
        if config.mooncake_protocol not in PROTOCOLS:
            raise ConfigError(where, key_prefix + "mooncake_protocol", f"got "
                              f"{config.mooncake_protocol!r}; accepted: {', '.join(PROTOCOLS)}")  # fmt: skip
        host, _, port = config.mooncake_master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                where, key_prefix + "mooncake_master", f"got {config.mooncake_master!r}; "
                "accepted: host:port of mooncake_master's RPC service (e.g. 10.0.0.5:50051)",
            )  # fmt: skip
        if not config.mooncake_metadata_server.startswith(METADATA_SCHEMES):
            raise ConfigError(
                where, key_prefix + "mooncake_metadata_server",
                f"got {config.mooncake_metadata_server!r}; accepted: http://host:port/metadata, "
                "etcd://host:port, redis://host:port or P2PHANDSHAKE",
            )  # fmt: skip

    def __init__(
        self, config: StoreConfig, probe: bool = True, who: str = "", gpu: int | None = None
    ) -> None:
        """Connect to the master; setup fails (and raises) if it does not answer, so the
        store is probed whatever `probe` says."""
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        except ImportError as exc:
            raise RuntimeError(
                f"memkv-vllm ({who}): backend=mooncake needs Mooncake Store's Python package "
                f"({exc}): pip install 'memkv-vllm[mooncake]' (and apt-get install libibverbs1)"
            ) from exc
        self.config = config
        hostname = config.mooncake_local_hostname or socket.gethostname()
        if config.mooncake_local_hostname:
            # advertise the transfer endpoint on the address we register under
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", config.mooncake_local_hostname)
        self._store = MooncakeDistributedStore()
        self._guard = MemberGuard(
            config.mooncake_master, "Mooncake Store (master)", self._probe, config.stall_budget_s
        )
        setup = (hostname, config.mooncake_metadata_server, config.mooncake_segment_mb << 20,
                 config.mooncake_buffer_mb << 20, config.mooncake_protocol,
                 _rdma_devices(config, gpu), config.mooncake_master)  # fmt: skip
        try:
            rc = self._guard.run("setup", lambda: self._store.setup(*setup), SETUP_DEADLINE_S)
        except MemberUnavailableError:
            rc = -901  # the master did not answer in time
        if rc != 0:
            self._guard.close()
            raise RuntimeError(
                f"memkv-vllm ({who}): Mooncake Store setup failed ({_cause(rc)}); check "
                f"mooncake_master={config.mooncake_master!r} and mooncake_metadata_server="
                f"{config.mooncake_metadata_server!r} (and that the master runs with "
                "--enable_http_metadata_server=true for an http:// metadata server)"
            )
        self._replicate = ReplicateConfig()
        self._replicate.replica_num = config.mooncake_replicas
        self._staging = _Staging(self._store.register_buffer)
        self._counters = StoreCounters()

    def _probe(self) -> None:
        """Raise unless the master answers an existence query."""
        (code,) = self._store.batch_is_exist([PROBE_KEY])
        if code < 0:
            raise RuntimeError(_cause(code))

    def describe(self) -> str:
        c = self.config
        return (
            f"Mooncake Store (master {c.mooncake_master}, metadata {c.mooncake_metadata_server}, "
            f"{c.mooncake_protocol}, {c.mooncake_replicas} replica(s), "
            f"{c.mooncake_segment_mb} MiB segment mounted here)"
        )

    @property
    def has_rdma(self) -> bool:
        return self.config.mooncake_protocol == "rdma"

    def register(self, buffer: Any) -> None:
        return None  # transfers stage through this store's own registered buffers

    # --- data path --------------------------------------------------------------------

    def _unavailable(self, n: int, exc: MemberUnavailableError) -> list[ItemOutcome]:
        return [ItemOutcome(False, str(exc), exc.address, True)] * n

    def exists(self, keys: list[bytes]) -> list[bool]:
        self._counters.add(exists_keys=len(keys))
        names = [mooncake_key(k) for k in keys]
        try:
            codes = self._guard.run(
                "exists", lambda: self._store.batch_is_exist(names), self.config.deadline_s()
            )
        except MemberUnavailableError:
            codes = [0] * len(keys)
        if any(c < 0 for c in codes):
            self._counters.add(exists_errors=1)
        return [c == 1 for c in codes]

    def _staged(self, items: list[Item]) -> tuple[np.ndarray, list[int], list[int]]:
        """A staging buffer for `items`, and each item's offset and length in it."""
        lengths = [length for _, _, length in items]
        offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        return self._staging.acquire(sum(lengths)), offsets, lengths

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        stage, offsets, lengths = self._staged(items)
        for (_, buffer, length), at in zip(items, offsets, strict=True):
            stage[at : at + length] = np.frombuffer(buffer, dtype=np.uint8)[:length]
        names = [mooncake_key(key) for key, _, _ in items]
        addrs = [int(stage.ctypes.data) + at for at in offsets]
        try:
            codes = self._guard.run(
                "put",
                lambda: self._store.batch_put_from(names, addrs, lengths, self._replicate),
                self.config.deadline_s(sum(lengths)),
                lambda: self._staging.release(stage),
            )
        except MemberUnavailableError as exc:
            out = self._unavailable(len(items), exc)
        else:
            self._staging.release(stage)
            out = [ItemOutcome(True) if c == 0 else ItemOutcome(False, _cause(c)) for c in codes]
        self._counters.count_puts(out, items)
        return out

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        stage, offsets, lengths = self._staged(items)
        names = [mooncake_key(key) for key, _, _ in items]
        addrs = [int(stage.ctypes.data) + at for at in offsets]
        try:
            codes = self._guard.run(
                "get",
                lambda: self._store.batch_get_into(names, addrs, lengths),
                self.config.deadline_s(sum(lengths)),
                lambda: self._staging.release(stage),
            )
        except MemberUnavailableError as exc:
            out = self._unavailable(len(items), exc)
        else:
            out = []
            for (_, buffer, length), at, code in zip(items, offsets, codes, strict=True):
                if code == length:
                    np.frombuffer(buffer, dtype=np.uint8)[:length] = stage[at : at + length]
                    out.append(ItemOutcome(True))
                else:
                    cause = _cause(code) if code < 0 else f"{code} bytes stored"
                    out.append(ItemOutcome(False, cause))
            self._staging.release(stage)
        self._counters.count_gets(out, items)
        return out

    def delete(self, keys: list[bytes]) -> list[ItemOutcome]:
        names = [mooncake_key(k) for k in keys]
        try:
            codes = self._guard.run(
                "remove", lambda: self._store.batch_remove(names), self.config.deadline_s()
            )
        except MemberUnavailableError as exc:
            return self._unavailable(len(keys), exc)
        return [ItemOutcome(True) if c == 0 else ItemOutcome(False, _cause(c)) for c in codes]

    def put_record(self, key: bytes, data: bytes) -> None:
        code = self._guard.run(
            "put",
            lambda: self._store.put(mooncake_key(key), data, self._replicate),
            self.config.deadline_s(len(data)),
        )
        if code != 0:
            raise RuntimeError(f"memkv-vllm: Mooncake put of {key!r} failed: {_cause(code)}")

    def get_record(self, key: bytes) -> bytes | None:
        data = self._guard.run(
            "get", lambda: self._store.get(mooncake_key(key)), self.config.deadline_s()
        )
        return bytes(data) if data else None

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, "master": self.config.mooncake_master,
                "deadline_misses": self._guard.deadline_misses, "skipped": self._guard.skipped,
                **self._counters.snapshot()}  # fmt: skip

    def health(self) -> list[MemberState]:
        return [self._guard.state()]

    def close(self) -> None:
        self._guard.close()
        for buf in self._staging.buffers:
            self._store.unregister_buffer(int(buf.ctypes.data))
        self._store.close()
