"""`MooncakeStore`: the store interface over Mooncake Store (`mooncake.store`).

Zero-copy where Mooncake allows it: buffers announced with `MooncakeStore.register`
(the tier's CPU pool, the direct worker's scratch) are registered with the transfer engine
once, and batches over them go through `batch_put_from` / `batch_get_into` by address.
Anything else (small records) goes through Mooncake's copying `put` / `get`.

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
from .protocol import Item, ItemOutcome, StoreCounters

if TYPE_CHECKING:
    from .settings import StoreConfig

__all__ = ["MooncakeStore", "mooncake_key"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers

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


def _address(buffer: Any) -> tuple[int, int]:
    array = np.frombuffer(buffer, dtype=np.uint8)
    return int(array.ctypes.data), int(array.nbytes)


def _rdma_devices(config: StoreConfig, gpu: int | None) -> str:
    if config.mooncake_protocol != "rdma" or config.mooncake_rdma_devices:
        return config.mooncake_rdma_devices
    return rank_nic(gpu) or ""  # "": Mooncake discovers the devices itself


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
        rc = self._store.setup(
            hostname,
            config.mooncake_metadata_server,
            config.mooncake_segment_mb << 20,
            config.mooncake_buffer_mb << 20,
            config.mooncake_protocol,
            _rdma_devices(config, gpu),
            config.mooncake_master,
        )
        if rc != 0:
            raise RuntimeError(
                f"memkv-vllm ({who}): Mooncake Store setup failed ({_cause(rc)}); check "
                f"mooncake_master={config.mooncake_master!r} and mooncake_metadata_server="
                f"{config.mooncake_metadata_server!r} (and that the master runs with "
                "--enable_http_metadata_server=true for an http:// metadata server)"
            )
        self._replicate = ReplicateConfig()
        self._replicate.replica_num = config.mooncake_replicas
        self._lock = threading.Lock()
        self._regions: list[tuple[int, int]] = []  # (start, end) of registered buffers
        self._counters = StoreCounters()
        self._warned_copy = False

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

    # --- buffers ----------------------------------------------------------------------

    def register(self, buffer: Any) -> None:
        start, size = _address(buffer)
        rc = self._store.register_buffer(start, size)
        if rc != 0:
            log.warning("memkv-vllm: Mooncake register_buffer(%d bytes) failed (%d); "
                        "transfers from it will copy", size, rc)  # fmt: skip
            return
        with self._lock:
            self._regions.append((start, start + size))

    def _split(self, items: list[Item]) -> tuple[list[int], list[int], list[int]]:
        """Positions of registered items, their addresses, and positions of the rest."""
        with self._lock:
            regions = list(self._regions)
        fast, addrs, slow = [], [], []
        for i, (_, buffer, length) in enumerate(items):
            start, size = _address(buffer)
            if size >= length and any(s <= start and start + length <= e for s, e in regions):
                fast.append(i)
                addrs.append(start)
            else:
                slow.append(i)
        if slow and not self._warned_copy:
            self._warned_copy = True
            log.warning("memkv-vllm: Mooncake transfers from unregistered memory copy "
                        "(register the buffer for zero-copy)")  # fmt: skip
        return fast, addrs, slow

    # --- data path --------------------------------------------------------------------

    def exists(self, keys: list[bytes]) -> list[bool]:
        self._counters.add(exists_keys=len(keys))
        codes = self._store.batch_is_exist([mooncake_key(k) for k in keys])
        if any(c < 0 for c in codes):
            self._counters.add(exists_errors=1)
        return [c == 1 for c in codes]

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        out = [ItemOutcome(False, "not attempted")] * len(items)
        fast, addrs, slow = self._split(items)
        if fast:
            codes = self._store.batch_put_from(
                [mooncake_key(items[i][0]) for i in fast],
                addrs,
                [items[i][2] for i in fast],
                self._replicate,
            )
            for i, code in zip(fast, codes, strict=True):
                out[i] = ItemOutcome(True) if code == 0 else ItemOutcome(False, _cause(code))
        for i in slow:
            key, buffer, length = items[i]
            data = np.frombuffer(buffer, dtype=np.uint8)[:length]
            code = self._store.put(mooncake_key(key), data, self._replicate)
            out[i] = ItemOutcome(True) if code == 0 else ItemOutcome(False, _cause(code))
        self._counters.count_puts(out, items)
        return out

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        out = [ItemOutcome(False, "not attempted")] * len(items)
        fast, addrs, slow = self._split(items)
        if fast:
            codes = self._store.batch_get_into(
                [mooncake_key(items[i][0]) for i in fast], addrs, [items[i][2] for i in fast]
            )
            for i, code in zip(fast, codes, strict=True):
                length = items[i][2]
                out[i] = (
                    ItemOutcome(True)
                    if code == length
                    else ItemOutcome(False, _cause(code) if code < 0 else f"{code} bytes stored")
                )
        for i in slow:
            key, buffer, length = items[i]
            data = self._store.get(mooncake_key(key))
            if len(data) == length:
                np.frombuffer(buffer, dtype=np.uint8)[:length] = np.frombuffer(data, np.uint8)
                out[i] = ItemOutcome(True)
            else:
                out[i] = ItemOutcome(False, "not found" if not data else f"{len(data)} bytes")
        self._counters.count_gets(out, items)
        return out

    def delete(self, keys: list[bytes]) -> list[ItemOutcome]:
        codes = self._store.batch_remove([mooncake_key(k) for k in keys])
        return [ItemOutcome(True) if c == 0 else ItemOutcome(False, _cause(c)) for c in codes]

    def put_record(self, key: bytes, data: bytes) -> None:
        code = self._store.put(mooncake_key(key), data, self._replicate)
        if code != 0:
            raise RuntimeError(f"memkv-vllm: Mooncake put of {key!r} failed: {_cause(code)}")

    def get_record(self, key: bytes) -> bytes | None:
        data = self._store.get(mooncake_key(key))
        return bytes(data) if data else None

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, "master": self.config.mooncake_master,
                **self._counters.snapshot()}  # fmt: skip

    def close(self) -> None:
        with self._lock:
            regions, self._regions = self._regions, []
        for start, _ in regions:
            self._store.unregister_buffer(start)
        self._store.close()
