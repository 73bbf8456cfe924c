"""`MooncakeStore`: the store interface over Mooncake Store (`mooncake.store`).

Mooncake's client has no per-call deadline and cannot cancel a call, so every call runs
under a `.guard.MemberGuard` (the stall budget): a member that misses a deadline is
skipped until its probe answers (calls abandoned meanwhile may still hang). The members:

* the master (`exists`, deletes, records, and locating the replicas a get reads);
* each store process holding data, by its transfer endpoint: a get asks the master where
  its keys live and reads each store's keys in a call of their own, so a stopped store
  costs one budget and then only its own keys read as unavailable;
* puts (the master places values, so a put cannot be steered off a store that hangs):
  a put that misses its deadline drops puts until a probe put answers; while a store is
  known down, puts prefer the store processes that answer.

Batches move through one staging arena registered at startup (`mooncake_staging_mb`;
`batch_put_from` / `batch_get_into` by address, one memory copy on our side), never
registered during a request: a call that missed its deadline may still run inside
Mooncake's transfer engine later, so its range stays taken until it returns; when the
arena is full a call fails at once (counted as `staging_full`). Small records go through
Mooncake's copying `put` / `get`.

Mooncake keys are strings: printable ASCII keys (the tier's names) are used as they are,
binary keys (the direct mode's) as `mkvh:<hex>`. Mooncake values are immutable (a put of
a present key keeps the old value) and a read takes a lease that blocks removal for
`--default_kv_lease_ttl`; both are harmless for content-addressed KV blocks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import urllib.error
import urllib.request
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
from kv_offload_settings import setting, settings_of
from vllm_kv_identity.doctor import Check

from ..errors import ConfigError
from ..rdma_nic import rank_nic
from .guard import Call, MemberGuard, MemberUnavailableError
from .health_board import HealthBoard
from .protocol import Item, ItemOutcome, MemberState, StoreCounters

if TYPE_CHECKING:
    from .settings import StoreConfig

__all__ = ["MooncakeSettings", "MooncakeStore", "mooncake_key"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers

SETUP_DEADLINE_S = 30.0  # connecting to the master at startup (retries included)
PROBE_KEY = "memkv-vllm/probe"
PROBE_BYTES = 4096  # the puts' probe value
ALIGN = 4096  # staging ranges start on page boundaries
LOST = (-704, -712)  # not found, replica gone: the master answered for that store
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


@dataclass(frozen=True)
class MooncakeSettings:
    """The `mooncake` backend's keys (store keys, looked up as `.settings` describes)."""

    mooncake_master: str = setting(
        "text",
        "`host:port` of `mooncake_master`'s RPC service.",
        accepts="host:port of mooncake_master's RPC service (e.g. 10.0.0.5:50051)",
    )
    mooncake_metadata_server: str = setting(
        "text",
        "Transfer-engine metadata service: the master's embedded one "
        "(`--enable_http_metadata_server=true`), etcd, redis, or none (`P2PHANDSHAKE`).",
        accepts="http://host:port/metadata, etcd://host:port, redis://host:port or P2PHANDSHAKE",
    )
    mooncake_protocol: str = setting("choice", "Transfer protocol.", "tcp", choices=PROTOCOLS)
    mooncake_rdma_devices: str = setting(
        "text",
        "RDMA devices for `rdma`; empty: the NIC on this rank's GPU's PCIe switch (sysfs, "
        "narrowed by `MEMKV_RDMA_DEVICES`; `memkv net topo` shows the choice).",
        "",
        accepts="comma-separated RDMA device names, or empty",
    )
    mooncake_local_hostname: str = setting(
        "text",
        "Address this process registers under (empty: the host name); also exported as "
        "`MC_TCP_BIND_ADDRESS` when set (Mooncake otherwise advertises the first "
        "non-loopback interface).",
        "",
        accepts="a host name or address, or empty",
    )
    mooncake_segment_mb: int = setting(
        "int",
        "MiB this process mounts into the pool (0: a pure client; memory comes from store "
        "processes).",
        0,
        minimum=0,
    )
    mooncake_buffer_mb: int = setting(
        "int",
        "MiB transfer buffer of this process (small records, unregistered memory).",
        64,
        minimum=16,
    )
    mooncake_staging_mb: int = setting(
        "int",
        "MiB staging arena every batch moves through, registered once at startup; a batch "
        "moves in calls of at most a quarter of it; when calls that timed out hold it all, a "
        "call fails at once (`staging_full`).",
        256,
        minimum=4,
    )
    mooncake_replicas: int = setting(
        "int", "Copies of each value, on different segments.", 1, minimum=1, maximum=16
    )


def _own(config: StoreConfig) -> MooncakeSettings:
    """The `mooncake_*` settings `StoreConfig.resolve` built for this backend."""
    own: MooncakeSettings = config.backend_settings
    return own


def mooncake_key(key: bytes) -> str:
    """The Mooncake key of one of our keys (printable ASCII as is, else `mkvh:<hex>`)."""
    if key.isascii():
        text = key.decode("ascii")
        if text.isprintable() and not text.startswith("mkvh:"):
            return text
    return "mkvh:" + key.hex()


def _bad(where: str, key_prefix: str, name: str, value: str) -> NoReturn:
    accepted = settings_of(MooncakeSettings)[name].accepted()
    raise ConfigError(where, "", f"{key_prefix + name} must be {accepted}, got {value!r}")


def _cause(code: int) -> str:
    return _CAUSES.get(code, f"Mooncake error {code}")


def _reachable(what: str, address: str, timeout: float, start: str) -> Check:
    """✔ if `address` (`host:port`) accepts a TCP connection within `timeout`; else ✖
    saying to `start` it."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        return Check.fail(
            f"{what} {address} is not reachable ({exc})",
            f"{start}, or correct the address; check the firewall",
        )
    return Check.ok(f"{what} {address} accepts connections")


def _metadata_check(url: str, timeout: float) -> Check:
    """Mooncake's metadata server: an HTTP one answers a GET (any status), etcd and redis
    accept a connection; P2PHANDSHAKE needs none."""
    if url == "P2PHANDSHAKE":
        return Check.ok("Mooncake metadata: P2PHANDSHAKE (no metadata server)")
    scheme, _, rest = url.partition("://")
    if scheme in ("etcd", "redis"):
        where = rest.split("/")[0]
        return _reachable(
            f"Mooncake metadata server ({scheme})", where, timeout, f"start {scheme} there"
        )
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        pass  # it answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Check.fail(
            f"Mooncake metadata server {url} does not answer ({reason})",
            "start mooncake_master with --enable_http_metadata_server=true on that port, or "
            "correct mooncake_metadata_server",
        )
    return Check.ok(f"Mooncake metadata server {url} answers")


def _rdma_devices(settings: MooncakeSettings, gpu: int | None) -> str:
    if settings.mooncake_protocol != "rdma" or settings.mooncake_rdma_devices:
        return settings.mooncake_rdma_devices
    return rank_nic(gpu) or ""  # "": Mooncake discovers the devices itself


class _Staging:
    """The registered arena: one contiguous range per call, given back once the call is
    over (first fit; neighbours merge). Thread-safe."""

    def __init__(self, nbytes: int) -> None:
        self.arena = np.empty(nbytes, dtype=np.uint8)
        self.address = int(self.arena.ctypes.data)
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, nbytes)]  # (offset, size), by offset
        self.full = 0
        """Calls refused for want of room (abandoned calls still hold theirs)."""

    def take(self, nbytes: int) -> tuple[np.ndarray, Callable[[], None]] | None:
        """A range of `nbytes` and what gives it back, or None when no range is free."""
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for i, (offset, room) in enumerate(self._free):
                if room >= size:
                    if room == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, room - size)
                    break
            else:
                self.full += 1
                return None
        given = threading.Event()

        def give_back() -> None:
            if not given.is_set():
                given.set()
                self._give(offset, size)

        return self.arena[offset : offset + nbytes], give_back

    def _give(self, offset: int, size: int) -> None:
        with self._lock:
            insort(self._free, (offset, size))
            merged: list[tuple[int, int]] = []
            for at, room in self._free:
                if merged and merged[-1][0] + merged[-1][1] == at:
                    merged[-1] = (merged[-1][0], merged[-1][1] + room)
                else:
                    merged.append((at, room))
            self._free = merged


class MooncakeStore:
    """The store interface over `MooncakeDistributedStore` (see `.protocol.KVStore`).

    `gpu` is this rank's GPU (for the RDMA NIC choice), None in the scheduler; `engine`
    the engine whose other stores share what this one finds down (`.health_board`).
    Raises `RuntimeError` when Mooncake is not installed or its setup fails (naming the
    key).
    """

    backend = "mooncake"
    settings_hint = (
        "Mooncake Store is set by mooncake_master and mooncake_metadata_server "
        "(MEMKV_MOONCAKE_MASTER, MEMKV_MOONCAKE_METADATA_SERVER)"
    )

    Settings = MooncakeSettings

    @classmethod
    def check_config(cls, config: StoreConfig, where: str, key_prefix: str) -> None:
        """Raise `ConfigError` for a `mooncake_master` that is not `host:port` or a
        metadata server of no known scheme (before anything connects)."""
        own = _own(config)
        host, _, port = own.mooncake_master.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            _bad(where, key_prefix, "mooncake_master", own.mooncake_master)
        if not own.mooncake_metadata_server.startswith(METADATA_SCHEMES):
            _bad(where, key_prefix, "mooncake_metadata_server", own.mooncake_metadata_server)

    @classmethod
    def uses_rdma(cls, config: StoreConfig) -> bool:
        """Whether values move over RDMA (`mooncake_protocol`)."""
        return _own(config).mooncake_protocol == "rdma"

    @classmethod
    def doctor_checks(cls, config: StoreConfig, timeout: float) -> list[Check]:
        """The master's RPC port accepts a connection and the metadata server answers,
        each within `timeout`."""
        own = _own(config)
        master = _reachable("Mooncake master", own.mooncake_master, timeout,
                            "start mooncake_master there (--rpc_port)")  # fmt: skip
        return [master, _metadata_check(own.mooncake_metadata_server, timeout)]

    def __init__(
        self,
        config: StoreConfig,
        probe: bool = True,
        who: str = "",
        gpu: int | None = None,
        engine: str | None = None,
    ) -> None:
        """Connect to the master and register the staging arena; setup fails (and raises)
        if the master does not answer, so the store is probed whatever `probe` says."""
        try:
            from mooncake.store import MooncakeDistributedStore, ReplicaStatus, ReplicateConfig
        except ImportError as exc:
            raise RuntimeError(
                f"memkv-vllm ({who}): backend=mooncake needs Mooncake Store's Python package "
                f"({exc}): pip install 'memkv-vllm[mooncake]' (and apt-get install libibverbs1)"
            ) from exc
        self.config = config
        self.settings = own = _own(config)
        hostname = own.mooncake_local_hostname or socket.gethostname()
        if own.mooncake_local_hostname:
            # advertise the transfer endpoint on the address we register under
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", own.mooncake_local_hostname)
        self._store = MooncakeDistributedStore()
        self._board = HealthBoard(engine)
        self._guard = self._member(own.mooncake_master, "Mooncake Store (master)", self._probe)
        setup = (hostname, own.mooncake_metadata_server, own.mooncake_segment_mb << 20,
                 own.mooncake_buffer_mb << 20, own.mooncake_protocol,
                 _rdma_devices(own, gpu), own.mooncake_master)  # fmt: skip
        self._staging = _Staging(own.mooncake_staging_mb << 20)
        where = (f"check mooncake_master={own.mooncake_master!r} and mooncake_metadata_server="
                 f"{own.mooncake_metadata_server!r} (and that the master runs with "
                 "--enable_http_metadata_server=true for an http:// metadata server)")  # fmt: skip
        rc = self._setup("setup", lambda: self._store.setup(*setup))
        if rc != 0:
            self._guard.close()
            raise RuntimeError(f"memkv-vllm ({who}): Mooncake Store setup failed ({_cause(rc)}); "
                               + where)  # fmt: skip
        arena = self._staging.arena.nbytes
        rc = self._setup("register", lambda: self._store.register_buffer(self._staging.address,
                                                                         arena))  # fmt: skip
        if rc != 0:
            self._guard.close()
            self._store.close()
            raise RuntimeError(
                f"memkv-vllm ({who}): Mooncake could not register the {arena >> 20} MiB staging "
                f"arena (mooncake_staging_mb, {_cause(rc)}); lower it, or {where}"
            )
        self._part_bytes = arena // 4  # a batch moves in calls of at most this many bytes
        self._replicate = ReplicateConfig()
        self._replicate.replica_num = own.mooncake_replicas
        self._new_placement = ReplicateConfig
        self._complete = ReplicaStatus.COMPLETE
        self._puts = self._member(f"{own.mooncake_master} (puts)", "Mooncake Store puts",
                                  self._probe_puts)  # fmt: skip
        self._lock = threading.Lock()
        self._stores: dict[str, MemberGuard] = {}  # store processes, by transfer endpoint
        self._probe_keys: dict[str, tuple[str, int]] = {}  # endpoint -> a value it holds
        self._serial = itertools.count()
        self._counters = StoreCounters()

    def _member(self, address: str, what: str, probe: Callable[[], object]) -> MemberGuard:
        return MemberGuard(address, what, probe, self.config.stall_budget_s, board=self._board)

    def _setup(self, op: str, call: Callable[[], int]) -> int:
        try:
            return self._guard.run(op, call, SETUP_DEADLINE_S)
        except MemberUnavailableError:
            return -901  # the master did not answer in time

    def _probe(self) -> None:
        """Raise unless the master answers an existence query."""
        (code,) = self._store.batch_is_exist([PROBE_KEY])
        if code < 0:
            raise RuntimeError(_cause(code))

    def _probe_store(self, endpoint: str) -> None:
        """Raise unless store process `endpoint` serves a value it holds (one whose value
        is gone since counts as answered: the master no longer sends reads there)."""
        name, length = self._probe_keys[endpoint]
        staged = self._staging.take(length)
        if staged is None:
            raise RuntimeError("the staging arena is full")
        stage, give_back = staged
        try:
            (code,) = self._store.batch_get_into([name], [int(stage.ctypes.data)], [length])
        finally:
            give_back()
        if code != length and code not in LOST:
            raise RuntimeError(_cause(code))

    def _probe_puts(self) -> None:
        """Raise unless a small put (placed as `batch_put` would) completes."""
        key = f"{PROBE_KEY}/{socket.gethostname()}/{os.getpid()}/{next(self._serial)}"
        code = self._store.put(key, bytes(PROBE_BYTES), self._placement())
        if code != 0:
            raise RuntimeError(_cause(code))
        self._store.remove(key)

    def _store_guard(self, endpoint: str) -> MemberGuard:
        with self._lock:
            guard = self._stores.get(endpoint)
            if guard is None:
                guard = self._stores[endpoint] = self._member(
                    endpoint, "Mooncake Store process", lambda: self._probe_store(endpoint)
                )
            return guard

    def _placement(self) -> Any:  # `ReplicateConfig`
        """Mooncake's own placement, unless a store process is known down: then the next
        of those that answer is preferred."""
        with self._lock:
            guards = list(self._stores.values())
        answering = [g.address for g in guards if g.up]
        if not answering or len(answering) == len(guards):
            return self._replicate
        config = self._new_placement()
        config.replica_num = self.settings.mooncake_replicas
        config.preferred_segment = answering[next(self._serial) % len(answering)]
        return config

    def describe(self) -> str:
        c = self.settings
        return (
            f"Mooncake Store (master {c.mooncake_master}, metadata {c.mooncake_metadata_server}, "
            f"{c.mooncake_protocol}, {c.mooncake_replicas} replica(s), "
            f"{c.mooncake_segment_mb} MiB segment mounted here)"
        )

    @property
    def has_rdma(self) -> bool:
        return self.uses_rdma(self.config)

    def register(self, buffer: Any) -> None:
        return None  # transfers stage through this store's own registered arena

    # --- data path --------------------------------------------------------------------

    def _unavailable(self, n: int, exc: MemberUnavailableError) -> list[ItemOutcome]:
        return [ItemOutcome(False, str(exc), exc.address, True)] * n

    def _full(self, n: int) -> list[ItemOutcome]:
        cause = "the staging arena is full (calls that timed out still hold it)"
        return [ItemOutcome(False, cause, self.settings.mooncake_master, True)] * n

    def _parts(self, positions: list[int], items: list[Item]) -> list[list[int]]:
        """`positions` in consecutive parts of at most `_part_bytes` (an item alone may
        be larger)."""
        parts: list[list[int]] = []
        size = self._part_bytes
        for i in positions:
            n = items[i][2]
            if parts and size + n <= self._part_bytes:
                parts[-1].append(i)
                size += n
            else:
                parts.append([i])
                size = n
        return parts

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

    def unanswered(self, keys: list[bytes], running: Callable[[], bool]) -> None:
        master = self._guard
        self._board.found_down(master.address, lambda: running() or not master.up)

    def _stage(
        self, items: list[Item]
    ) -> tuple[np.ndarray, list[int], list[int], Callable[[], None]] | None:
        """A staging range for `items`, each item's offset and length in it, and what
        gives the range back; None when the arena is full."""
        lengths = [length for _, _, length in items]
        staged = self._staging.take(sum(lengths))
        if staged is None:
            return None
        offsets = list(itertools.accumulate(lengths, initial=0))[:-1]
        return staged[0], offsets, lengths, staged[1]

    def batch_put(self, items: list[Item]) -> list[ItemOutcome]:
        out: list[ItemOutcome] = []
        for part in self._parts(list(range(len(items))), items):
            out += self._put([items[i] for i in part])
        self._counters.count_puts(out, items)
        return out

    def _put(self, items: list[Item]) -> list[ItemOutcome]:
        if not self._guard.up:  # a put needs the master
            cause = "Mooncake Store (master) is down (skipped)"
            return [ItemOutcome(False, cause, self.settings.mooncake_master, True)] * len(items)
        staged = self._stage(items)
        if staged is None:
            return self._full(len(items))
        stage, offsets, lengths, give_back = staged
        for (_, buffer, length), at in zip(items, offsets, strict=True):
            stage[at : at + length] = np.frombuffer(buffer, dtype=np.uint8)[:length]
        names = [mooncake_key(key) for key, _, _ in items]
        addrs = [int(stage.ctypes.data) + at for at in offsets]
        placement = self._placement()
        try:
            codes = self._puts.run(
                "put",
                lambda: self._store.batch_put_from(names, addrs, lengths, placement),
                self.config.deadline_s(sum(lengths)),
                give_back,
            )
        except MemberUnavailableError as exc:
            if exc.timed_out:
                self._check_master()
            return self._unavailable(len(items), exc)
        give_back()
        return [ItemOutcome(True) if c == 0 else ItemOutcome(False, _cause(c)) for c in codes]

    def _check_master(self) -> None:
        """After a put missed its deadline: was it the master? A master that does not
        answer a probe within a tenth of the budget is down for every call."""
        with contextlib.suppress(MemberUnavailableError, RuntimeError):
            self._guard.run("probe", self._probe, self.config.stall_budget_s / 10)

    def _endpoint(self, replicas: list[Any]) -> str | None:
        """The store process a get of a value with `replicas` reads (its first complete
        memory replica's; "" for another medium, read under the master), None if none."""
        for replica in replicas:
            if replica.status == self._complete:
                if not replica.is_memory_replica():
                    return ""
                return str(replica.get_memory_descriptor().buffer_descriptor.transport_endpoint)
        return None

    def batch_get_into(self, items: list[Item]) -> list[ItemOutcome]:
        out = [ItemOutcome(False, _cause(-704))] * len(items)
        names = [mooncake_key(key) for key, _, _ in items]
        try:
            where = self._guard.run("locate", lambda: self._store.batch_get_replica_desc(names),
                                    self.config.deadline_s())  # fmt: skip
        except MemberUnavailableError as exc:
            out = self._unavailable(len(items), exc)
            self._counters.count_gets(out, items)
            return out
        by_store: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            endpoint = self._endpoint(where.get(name, []))
            if endpoint is not None:
                by_store.setdefault(endpoint, []).append(i)
        started = [self._start_get(endpoint, part, items, names)
                   for endpoint, positions in by_store.items()
                   for part in self._parts(positions, items)]  # fmt: skip
        for part in started:  # the stores' calls run in parallel, each under its deadline
            for i, outcome in part if isinstance(part, list) else part.finish(items):
                out[i] = outcome
        self._counters.count_gets(out, items)
        return out

    def _start_get(
        self, endpoint: str, positions: list[int], items: list[Item], names: list[str]
    ) -> _StartedGet | list[tuple[int, ItemOutcome]]:
        """The get of `positions` from store `endpoint` started, or their outcomes now."""
        guard = self._store_guard(endpoint) if endpoint else self._guard
        part = [items[i] for i in positions]
        staged = self._stage(part)
        if staged is None:
            return list(zip(positions, self._full(len(part)), strict=True))
        stage, offsets, lengths, give_back = staged
        part_names = [names[i] for i in positions]
        addrs = [int(stage.ctypes.data) + at for at in offsets]
        if endpoint:
            self._probe_keys[endpoint] = (part_names[0], lengths[0])
        try:
            call = guard.start("get", lambda: self._store.batch_get_into(part_names, addrs, lengths),
                               self.config.deadline_s(sum(lengths)), give_back)  # fmt: skip
        except MemberUnavailableError as exc:
            return list(zip(positions, self._unavailable(len(part), exc), strict=True))
        return _StartedGet(positions, guard, call, stage, offsets, give_back)

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
        code = self._puts.run(
            "put",
            lambda: self._store.put(mooncake_key(key), data, self._placement()),
            self.config.deadline_s(len(data)),
        )
        if code != 0:
            raise RuntimeError(f"memkv-vllm: Mooncake put of {key!r} failed: {_cause(code)}")

    def get_record(self, key: bytes) -> bytes | None:
        data = self._guard.run(
            "get", lambda: self._store.get(mooncake_key(key)), self.config.deadline_s()
        )
        return bytes(data) if data else None

    def _members(self) -> list[MemberGuard]:
        with self._lock:
            return [self._guard, self._puts, *self._stores.values()]

    def stats(self) -> dict[str, Any]:
        members = self._members()
        return {"backend": self.backend, "master": self.settings.mooncake_master,
                "deadline_misses": sum(g.deadline_misses for g in members),
                "skipped": sum(g.skipped for g in members), "staging_full": self._staging.full,
                **self._counters.snapshot()}  # fmt: skip

    def health(self) -> list[MemberState]:
        return [g.state() for g in self._members()]

    def close(self) -> None:
        for guard in self._members():
            guard.close()
        self._board.close()
        self._store.unregister_buffer(self._staging.address)
        self._store.close()


@dataclass(frozen=True)
class _StartedGet:
    """One store process's share of a `batch_get_into`, started under its guard."""

    positions: list[int]
    guard: MemberGuard
    call: Call[list[int]]
    stage: np.ndarray
    offsets: list[int]
    give_back: Callable[[], None]

    def finish(self, items: list[Item]) -> list[tuple[int, ItemOutcome]]:
        """Each position's outcome, the values copied out of the staging range."""
        try:
            codes = self.guard.finish(self.call)
        except MemberUnavailableError as exc:
            outcome = ItemOutcome(False, str(exc), exc.address, True)
            return [(i, outcome) for i in self.positions]
        out = []
        for i, at, code in zip(self.positions, self.offsets, codes, strict=True):
            _, buffer, length = items[i]
            if code == length:
                np.frombuffer(buffer, dtype=np.uint8)[:length] = self.stage[at : at + length]
                out.append((i, ItemOutcome(True)))
            else:
                cause = _cause(code) if code < 0 else f"{code} bytes stored"
                out.append((i, ItemOutcome(False, cause)))
        self.give_back()
        return out
