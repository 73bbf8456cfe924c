"""`MemKVStore`: the store interface over our `memkv serve` cluster (`memkv_client`).

A thin adapter: connection settings come from `MEMKV_CONFIG` / `MEMKV_*` exactly as for
`memkv_client`, except that a rank with a GPU drives RDMA through its GPU's NIC (see
`MemKVStore`); the batch calls pass the caller's buffers straight to the client (no
Python-side copies). Written against the client's public API only; its per-item results
are read through `bool()` and an optional `cause`.

The client keeps each member's health (deadlines, a background probe); this adapter
shares it with the engine's other stores (`.health_board`): a member the client marks
down is marked for the engine, and keys on a member another store marked down are left
out of the call (routed as the client routes them, `memkv_client.routing`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import memkv_client
from memkv_client.routing import Router
from vllm_kv_identity.doctor import Check

from ..rdma_nic import rank_nic
from .health_board import HealthBoard
from .protocol import Item, ItemOutcome, MemberState, StoreCounters
from .settings import read_sources

if TYPE_CHECKING:
    from .settings import StoreConfig

__all__ = ["MemKVStore", "servers_source"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
T = TypeVar("T")
DOCTOR_KEY = b"memkv-vllm/doctor"  # the key `doctor_checks` asks each server about


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


def _client(
    sources: memkv_client.ConfigSources, gpu: int | None, sysfs: str | Path
) -> memkv_client.Client:
    """A `memkv_client.Client`; on GPU `gpu`'s NIC where `MemKVStore` says so."""
    config = sources.client_config()
    devices = sources.lookup("rdma_devices")
    if gpu is not None and config.transport is not memkv_client.Transport.TCP:
        candidates = config.rdma_devices if devices is not None and devices.in_file else None
        source = f"rdma_devices in MEMKV_CONFIG {sources.path}"
        nic = rank_nic(gpu, candidates, source, sysfs)
        if nic is not None:
            config = dataclasses.replace(config, rdma_devices=(nic,))
    return memkv_client.Client(config=config)


def _doctor_check(client: memkv_client.Client, server: str, timeout: float) -> Check:
    """`server` answers an `exists` request signed with our key within `timeout`."""
    try:
        client.exists_on(server, [DOCTOR_KEY], timeout=timeout)
    except memkv_client.AuthError as exc:
        return Check.fail(
            f"MemKV server {server} refuses our auth key ({exc})",
            "set the same MEMKV_AUTH_KEY for the server and every vLLM instance (on one "
            "host: run both as the same user, sharing ~/.config/memkv/auth.key)",
        )
    except memkv_client.MemKVError as exc:
        return Check.fail(
            f"MemKV server {server} does not answer within {timeout:g} s ({exc})",
            f"start `memkv serve --listen {server}` there, or correct the servers "
            f"({servers_source()})",
        )
    return Check.ok(f"MemKV server {server} answers and accepts our auth key")


class MemKVStore:
    """The store interface over `memkv_client.Client` (see `.protocol.KVStore`).

    `gpu` is this rank's CUDA device (None in the scheduler). A rank with a GPU, whose
    `transport` allows RDMA, drives RDMA through the NIC closest to its GPU (`PIX`: on
    its PCIe switch, read from `sysfs`; `.rdma_nic.rank_nic`), logged once. The
    candidates are the `rdma_devices` the user set (in `MEMKV_CONFIG`, else
    `MEMKV_RDMA_DEVICES`), else every NIC with an active port: the client's default
    `mlx5_0` pins no rank. Without a GPU, or with no candidate NIC in sysfs, the
    client's own `rdma_devices` stays as it is. `engine`: share what this store finds
    down with that engine's other stores (`.health_board`).
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
        engine: str | None = None,
    ) -> None:
        self._client = _client(config.sources or read_sources(), gpu, sysfs)
        self._config = config
        self._counters = StoreCounters()
        self._servers = self._client.servers()
        self._router = Router(self._servers)
        self._board = HealthBoard(engine)
        self._published = dict.fromkeys(self._servers, 0)  # went_down marked on the board
        if probe:
            self._probe(who)

    @classmethod
    def check_config(cls, config: StoreConfig, where: str, key_prefix: str) -> None:
        """Nothing to check: the connection settings are memkv-client's (`MEMKV_*`)."""

    @classmethod
    def uses_rdma(cls, config: StoreConfig) -> bool:
        """Whether the client's settings (`transport`) choose RDMA."""
        if config.sources is None:
            return False
        return config.sources.client_config().transport is memkv_client.Transport.RDMA

    @classmethod
    def doctor_checks(cls, config: StoreConfig, timeout: float) -> list[Check]:
        """Each MemKV server answers an `exists` request signed with our key within
        `timeout` (over TCP: the handshake every transport starts with)."""
        try:
            sources = config.sources or memkv_client.ConfigSources.read()
            settings = sources.client_config()
            client = memkv_client.Client(
                config=dataclasses.replace(settings, transport=memkv_client.Transport.TCP)
            )
        except memkv_client.MemKVError as exc:
            return [Check.fail(f"MemKV client settings: {exc}", "correct that setting")]
        with client:
            return [_doctor_check(client, server, timeout) for server in client.servers()]

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

    # --- sharing member health with the engine's other stores ---------------------------

    def _shared(
        self, keys: list[bytes], call: Callable[[list[int]], list[T]], skipped: Callable[[str], T]
    ) -> list[T]:
        """`call(positions)`'s answers for the keys on members this engine has up, and
        `skipped(member)` for the others; then the client's new down members marked."""
        down = {m for m in self._servers if self._board.skip(m)}
        owner = [self._servers[self._router.route(k)] for k in keys] if down else []
        send = [i for i in range(len(keys)) if not down or owner[i] not in down]
        answers = call(send) if send else []
        out = {i: a for i, a in zip(send, answers, strict=True)}
        result = [out[i] if i in out else skipped(owner[i]) for i in range(len(keys))]
        self._publish()
        return result

    def _publish(self) -> None:
        """Mark each member the client found down since the last call, until it is up."""
        for member in self._client.member_health():
            if not member.up and member.went_down > self._published[member.address]:
                self._published[member.address] = member.went_down
                self._board.found_down(member.address, partial(self._down_here, member.address))

    def _down_here(self, address: str) -> bool:
        return not all(m.up for m in self._client.member_health() if m.address == address)

    @staticmethod
    def _skipped(member: str) -> ItemOutcome:
        return ItemOutcome(False, f"member {member} is down (found by this engine; skipped)",
                           member, True)  # fmt: skip

    # --- data path ----------------------------------------------------------------------

    def exists(self, keys: list[bytes]) -> list[bool]:
        self._counters.add(exists_keys=len(keys))
        timeout = self._config.deadline_s()

        def call(send: list[int]) -> list[bool]:
            found = self._client.exists([keys[i] for i in send], timeout=timeout)
            return [bool(x) for x in found]

        return self._shared(keys, call, lambda _: False)

    def unanswered(self, keys: list[bytes], running: Callable[[], bool]) -> None:
        for member in {self._servers[self._router.route(k)] for k in keys}:
            self._board.found_down(member, partial(self._waited_on, member, running))

    def _waited_on(self, address: str, running: Callable[[], bool]) -> bool:
        return running() or self._down_here(address)

    def register(self, buffer: Any) -> None:
        return None  # the client moves any buffer in place; RDMA registration is its own

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        timeout = self._config.deadline_s(_nbytes(items))

        def call(send: list[int]) -> list[ItemOutcome]:
            sent = self._client.batch_put_views([items[i] for i in send], timeout=timeout)
            return [_outcome(r) for r in sent]

        out = self._shared([k for k, _, _ in items], call, self._skipped)
        self._counters.count_puts(out, items)
        return out

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        timeout = self._config.deadline_s(_nbytes(items))

        def call(send: list[int]) -> list[ItemOutcome]:
            got = self._client.batch_get_into([items[i] for i in send], timeout=timeout)
            return [_outcome(r) for r in got]

        out = self._shared([k for k, _, _ in items], call, self._skipped)
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
        board = self._board
        return [
            MemberState(m.address, m.up and not board.skip(m.address),
                        m.went_down + board.went_down.get(m.address, 0),
                        m.came_up + board.came_up.get(m.address, 0))
            for m in self._client.member_health()
        ]  # fmt: skip

    def close(self) -> None:
        self._board.close()
        self._client.close()
