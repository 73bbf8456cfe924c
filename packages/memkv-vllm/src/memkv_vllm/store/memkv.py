"""`MemKVStore`: the store interface over our `memkv serve` cluster (`memkv_client`).

A thin adapter: connection settings come from `MEMKV_CONFIG` / `MEMKV_*` exactly as for
`memkv_client`, except that a rank with a GPU drives RDMA through its GPU's NIC (see
`MemKVStore`); the batch calls pass the caller's buffers straight to the client (no
Python-side copies). Written against the client's public API only; its per-item results
are read through `bool()` and an optional `cause`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..rdma_nic import rank_nic
from .protocol import Item, ItemOutcome, MemberState, StoreCounters
from .settings import read_sources

if TYPE_CHECKING:
    from memkv_client import Client, ConfigSources

    from .settings import StoreConfig

__all__ = ["MemKVStore", "servers_source"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


def _outcome(result: Any) -> ItemOutcome:
    unavailable = bool(result.timed_out or result.member_down)
    return ItemOutcome(bool(result), str(result.cause), result.member, unavailable)


def _nbytes(items: list[Item]) -> int:
    return sum(length for _, _, length in items)


def servers_source(env: Mapping[str, str] = os.environ) -> str:
    """Where memkv-client takes the server list from, naming the settings a user edits."""
    config = env.get("MEMKV_CONFIG")
    servers = env.get("MEMKV_SERVERS")
    return (
        f"taken from the servers: field of MEMKV_CONFIG ({config or 'unset'}), "
        f"else MEMKV_SERVERS ({servers or 'unset'}), else the default 127.0.0.1:9900"
    )


def _client(sources: ConfigSources, gpu: int | None, sysfs: str | Path) -> Client:
    """A `memkv_client.Client`; on GPU `gpu`'s NIC where `MemKVStore` says so."""
    import memkv_client

    config = sources.client_config()
    devices = sources.lookup("rdma_devices")
    if gpu is not None and config.transport is not memkv_client.Transport.TCP:
        candidates = config.rdma_devices if devices is not None and devices.in_file else None
        source = f"rdma_devices in MEMKV_CONFIG {sources.path}"
        nic = rank_nic(gpu, candidates, source, sysfs)
        if nic is not None:
            config = dataclasses.replace(config, rdma_devices=(nic,))
    return memkv_client.Client(config=config)


class MemKVStore:
    """The store interface over `memkv_client.Client` (see `.protocol.KVStore`).

    `gpu` is this rank's CUDA device (None in the scheduler). A rank with a GPU, whose
    `transport` allows RDMA, drives RDMA through the NIC closest to its GPU (`PIX`: on
    its PCIe switch, read from `sysfs`; `.rdma_nic.rank_nic`), logged once. The
    candidates are the `rdma_devices` the user set (in `MEMKV_CONFIG`, else
    `MEMKV_RDMA_DEVICES`), else every NIC with an active port: the client's default
    `mlx5_0` pins no rank. Without a GPU, or with no candidate NIC in sysfs, the
    client's own `rdma_devices` stays as it is.
    """

    backend = "memkv"
    settings_hint = "MemKV servers are set by MEMKV_SERVERS or the servers: field of MEMKV_CONFIG"

    def __init__(
        self,
        config: StoreConfig,
        probe: bool,
        who: str,
        gpu: int | None = None,
        sysfs: str | Path = "/sys",
    ) -> None:
        self._client = _client(config.sources or read_sources(), gpu, sysfs)
        self._config = config
        self._counters = StoreCounters()
        if probe:
            self._probe(who)

    @classmethod
    def check_config(cls, config: StoreConfig, where: str, key_prefix: str) -> None:
        """Nothing to check: the connection settings are memkv-client's (`MEMKV_*`)."""

    def _probe(self, who: str) -> None:
        servers = self._client.servers()
        for server in servers:
            try:
                self._client.exists_on(
                    server, [b"memkv-vllm/probe"], timeout=self._config.deadline_s()
                )
            except Exception as exc:
                self._client.close()
                raise RuntimeError(
                    f"memkv-vllm ({who}): MemKV server {server} does not answer ({exc}). "
                    f"Configured servers: {', '.join(servers)}, {servers_source()}. Start "
                    "`memkv serve` there, or point MEMKV_SERVERS at a running server."
                ) from exc

    def describe(self) -> str:
        servers = self._client.servers()
        transport = "RDMA" if self._client.has_rdma() else "TCP"
        return f"{len(servers)} MemKV server(s) {','.join(servers)} over {transport}"

    @property
    def has_rdma(self) -> bool:
        return bool(self._client.has_rdma())

    def exists(self, keys: list[bytes]) -> list[bool]:
        self._counters.add(exists_keys=len(keys))
        return [bool(x) for x in self._client.exists(keys, timeout=self._config.deadline_s())]

    def register(self, buffer: Any) -> None:
        return None  # the client moves any buffer in place; RDMA registration is its own

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        timeout = self._config.deadline_s(_nbytes(items))
        out = [_outcome(r) for r in self._client.batch_put_views(items, timeout=timeout)]
        self._counters.count_puts(out, items)
        return out

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        timeout = self._config.deadline_s(_nbytes(items))
        out = [_outcome(r) for r in self._client.batch_get_into(items, timeout=timeout)]
        self._counters.count_gets(out, items)
        return out

    def delete(self, keys: list[bytes]) -> list[ItemOutcome]:
        timeout = self._config.deadline_s()
        return [ItemOutcome(bool(self._client.delete(k, timeout=timeout))) for k in keys]

    def put_record(self, key: bytes, data: bytes) -> None:
        self._client.put(key, data, timeout=self._config.deadline_s(len(data)))

    def get_record(self, key: bytes) -> bytes | None:
        value: bytes | None = self._client.get(key, timeout=self._config.deadline_s())
        return value

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, **self._counters.snapshot()}

    def health(self) -> list[MemberState]:
        return [
            MemberState(m.address, m.up, m.went_down, m.came_up)
            for m in self._client.member_health()
        ]

    def close(self) -> None:
        self._client.close()
