"""The client facade: the vendor client's API over HRW routing and per-server pools.

`Client` is thread-safe: any number of threads may call any method at once.
Batch calls split their items per server (HRW) and into requests of at most
`max_batch_size` items / `max_request_mb` bytes, run those requests concurrently
(one connection each, up to `num_connections` per server) and return per-item
results in input order.

Every call runs under one deadline: its `timeout=` argument (seconds), else
`request_timeout_ms` plus 1 s per 16 MiB of values it moves. It bounds waiting for a
connection, connecting and every socket wait. A member that misses a deadline or
refuses a connection is skipped (`memkv_client.health`) until a background probe
succeeds: its keys read as absent, its items as `TRANSPORT` results with
`member_down`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from . import protocol as p
from .auth import Signer, user_key, user_key_path
from .batching import split_requests
from .buffers import BufferOrAddress, as_key, as_keys, as_tuples, as_view, check_count
from .config import Config, Transport, load_config
from .errors import (
    ConfigError,
    LocalProtocolError,
    MemberDownError,
    MemKVError,
    RdmaUnavailableError,
    TransportError,
    ValueTooLargeError,
    error_from_status,
)
from .health import MemberHealth
from .pool import ServerPool
from .protocol import Status
from .results import ItemResult, ResultKind, failure_result, result_from_status
from .routing import Router
from .session import _MIN_RATE, TcpSession
from .sockio import is_loopback, parse_address

__all__ = ["Client"]

log = logging.getLogger("memkv_client")
T = TypeVar("T")
_EXISTS_CHUNK = 512  # keys per EXISTS request (keys are small; meta stays < 1 MiB)
Item = tuple[bytes | str, BufferOrAddress, int]
XferItem = tuple[bytes | str, int, int, int]  # key, address, length, value_offset


class Client:
    """A MemKV client.

    Settings come from `config` (a ready `Config`) or else from `MEMKV_CONFIG`, the
    `MEMKV_*` variables and defaults, with `overrides` (setting names) on top;
    `rdma_devices` overrides that setting. `verbs_backend` (a
    `memkv_client.verbs.VerbsBackend`) is used for RDMA instead of probing pyverbs
    (alternative providers, tests). Raises `ConfigError` naming an invalid setting, and
    `RdmaUnavailableError` for `transport=rdma` without a usable RDMA device.
    """

    def __init__(
        self,
        rdma_devices: Sequence[str] | None = None,
        *,
        config: Config | None = None,
        verbs_backend: Any = None,
        **overrides: Any,
    ) -> None:
        if config is None:
            if rdma_devices is not None:
                overrides["rdma_devices"] = list(rdma_devices)
            config = load_config(**overrides)
        self.config = config
        key = config.auth_key
        if key is None:
            hosts = [parse_address(s)[0] for s in config.servers]
            if not all(is_loopback(h) for h in hosts):
                raise ConfigError(
                    "auth_key", "required when any server is not on loopback (MEMKV_AUTH_KEY)"
                )
            try:
                key = user_key(user_key_path())
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    "auth_key", f"no key configured and the user key: {exc}"
                ) from None
        self._signer = Signer(key)
        self._router = Router(config.servers)
        self._no_rdma = "transport=tcp"  # why there is no RDMA engine (for batch_xfer)
        self._rdma = self._select_rdma(verbs_backend)
        self._pools = [self._make_pool(i, addr) for i, addr in enumerate(config.servers)]
        workers = min(256, max(4, len(config.servers) * config.num_connections))
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="memkv")
        self._closed = False
        self._lock = threading.Lock()
        self._max_request = config.max_request_mb << 20
        self._max_items = min(config.max_batch_size, p.MAX_BATCH_ITEMS)
        self._warned: dict[str, float] = {}

    # --- construction helpers ----------------------------------------------------------

    def _select_rdma(self, verbs_backend: Any) -> Any:
        """The RDMA engine to use, or None for TCP (logs the one info line on fallback)."""
        if self.config.transport is Transport.TCP:
            return None
        from .rdma import RdmaEngine, open_verbs_backend_for

        want = self.config.transport is not Transport.AUTO
        backend, reason = (
            (verbs_backend, "") if verbs_backend else open_verbs_backend_for(self.config)
        )
        if backend is None:
            if want:
                raise RdmaUnavailableError(f"transport={self.config.transport.value}: {reason}")
            log.info("memkv: RDMA unavailable (%s); using TCP", reason)
            self._no_rdma = f"transport=auto found no RDMA: {reason}"
            return None
        return RdmaEngine(backend, self.config)

    def _make_pool(self, index: int, address: str) -> ServerPool[Any]:
        config = self.config
        bind = config.bind_addresses[index % len(config.bind_addresses)]

        def factory(timeout: float) -> TcpSession:
            """A session within `timeout` s: connect, HELLO and (RDMA) queue-pair setup."""
            deadline = time.monotonic() + timeout
            session = TcpSession(address, config, self._signer, bind, deadline)
            if self._rdma is not None:
                return self._rdma.upgrade(session)  # type: ignore[no-any-return]
            return session

        return ServerPool(
            address,
            factory,
            config.num_connections,
            ping=lambda s: s.exists([]),
            connect_timeout=config.connect_timeout_ms / 1000,
            probe_interval=config.probe_interval_ms / 1000,
        )

    # --- plumbing ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("client is closed")

    def _deadline(self, timeout: float | None, nbytes: int = 0) -> float:
        """The monotonic deadline of a call given `timeout=` and the bytes it moves."""
        if timeout is None:
            return time.monotonic() + self.config.request_timeout_ms / 1000 + nbytes / _MIN_RATE
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise LocalProtocolError(f"timeout={timeout!r}: pass seconds (a number) or None")
        if not 0 < timeout < math.inf:
            raise LocalProtocolError(f"timeout={timeout!r}: pass a positive finite number")
        return time.monotonic() + timeout

    def _server_index(self, server: str | int) -> int:
        if isinstance(server, int):
            if not 0 <= server < len(self._pools):
                raise LocalProtocolError(f"server index {server} out of range")
            return server
        try:
            return self.config.servers.index(server)
        except ValueError:
            raise LocalProtocolError(
                f"unknown server {server!r}; configured: {', '.join(self.config.servers)}"
            ) from None

    def _run_all(self, tasks: list[Callable[[], T]]) -> list[T | BaseException]:
        """Run tasks concurrently (the first inline); return results or exceptions."""
        futures: list[Future[T]] = [self._executor.submit(t) for t in tasks[1:]]
        out: list[T | BaseException] = []
        if tasks:
            try:
                out.append(tasks[0]())
            except MemKVError as exc:
                out.append(exc)
        for f in futures:
            try:
                out.append(f.result())
            except MemKVError as exc:
                out.append(exc)
        return out

    def _chunks(
        self,
        positions: list[int],
        sizes: Sequence[int],
        max_items: int,
        together: Sequence[bytes] | None = None,
    ) -> list[list[int]]:
        """One server's items as requests (`batching.split_requests` with our limits)."""
        return split_requests(
            positions,
            sizes,
            max_items=max_items,
            max_bytes=self._max_request,
            connections=self.config.num_connections,
            together=together,
        )

    def _batch(
        self,
        keys: list[bytes],
        sizes: Sequence[int],
        op: Callable[[Any, list[int]], list[ItemResult]],
        deadline: float,
        keep_keys_together: bool = False,
    ) -> list[ItemResult]:
        self._check_open()
        results: list[ItemResult] = [ItemResult(ResultKind.TRANSPORT, "not attempted")] * len(keys)
        tasks: list[Callable[[], tuple[list[int], list[ItemResult]]]] = []
        for server, positions in self._router.group(keys).items():
            pool = self._pools[server]
            together = None
            if keep_keys_together:  # equal keys adjacent, in order of first appearance
                first: dict[bytes, int] = {}
                for pos in positions:
                    first.setdefault(keys[pos], pos)
                positions = sorted(positions, key=lambda pos: (first[keys[pos]], pos))
                together = keys
            for chunk in self._chunks(positions, sizes, self._max_items, together):

                def task(
                    pool: ServerPool[Any] = pool, chunk: list[int] = chunk
                ) -> tuple[list[int], list[ItemResult]]:
                    try:
                        return chunk, pool.run(lambda s: op(s, chunk), deadline)
                    except (MemKVError, OSError) as exc:  # OSError: defence in depth
                        return chunk, [failure_result(exc, pool.address)] * len(chunk)

                tasks.append(task)
        for outcome in self._run_all(tasks):
            assert not isinstance(outcome, BaseException)
            chunk, chunk_results = outcome
            for pos, r in zip(chunk, chunk_results, strict=True):
                results[pos] = r
        return results

    def _warn_limited(self, topic: str, message: str) -> None:
        """Log a warning at most once per 10 s per topic (hot paths such as exists)."""
        now = time.monotonic()
        with self._lock:
            if now - self._warned.get(topic, -1e9) < 10.0:
                return
            self._warned[topic] = now
        log.warning("memkv: %s", message)

    def _check_value_len(self, n: int, key: bytes) -> None:
        if n > p.DEFAULT_MAX_VALUE_LEN:
            raise ValueTooLargeError(
                f"value of {n} bytes for key {key[:40]!r} exceeds the {p.DEFAULT_MAX_VALUE_LEN}"
                "-byte protocol limit"
            )

    # --- the vendor API ----------------------------------------------------------------

    def exists(self, keys: Iterable[bytes | str], *, timeout: float | None = None) -> list[bool]:
        """Which keys are present, in input order, by the deadline. Keys on a member that
        is unreachable, missed the deadline or is marked down read False."""
        self._check_open()
        kb = as_keys(keys, "exists")
        deadline = self._deadline(timeout)
        out = [False] * len(kb)
        tasks: list[Callable[[], tuple[list[int], list[bool] | MemKVError, str]]] = []
        for server, positions in self._router.group(kb).items():
            pool = self._pools[server]
            for chunk in self._chunks(positions, [0] * len(kb), _EXISTS_CHUNK):

                def task(
                    pool: ServerPool[Any] = pool, chunk: list[int] = chunk
                ) -> tuple[list[int], list[bool] | MemKVError, str]:
                    try:
                        flags = pool.run(lambda s: s.exists([kb[i] for i in chunk]), deadline)
                    except MemKVError as exc:
                        return chunk, exc, pool.address
                    except OSError as exc:  # defence in depth: sessions wrap these
                        return chunk, TransportError(str(exc)), pool.address
                    return chunk, flags, pool.address

                tasks.append(task)
        for outcome in self._run_all(tasks):
            assert not isinstance(outcome, BaseException)
            chunk, flags, address = outcome
            if isinstance(flags, MemKVError):
                if not isinstance(flags, MemberDownError):  # its transition was logged
                    self._warn_limited(address, f"exists: {flags} (reported as absent)")
                continue
            for pos, flag in zip(chunk, flags, strict=True):
                out[pos] = flag
        return out

    def exists_on(
        self, server: str | int, keys: Iterable[bytes | str], *, timeout: float | None = None
    ) -> list[bool]:
        """Ask one server directly (bypasses HRW); raises on any error, including
        `MemberDownError` while that member is marked down."""
        self._check_open()
        pool = self._pools[self._server_index(server)]
        kb = as_keys(keys, "exists_on")
        deadline = self._deadline(timeout)
        out: list[bool] = []
        for start in range(0, len(kb), self.config.max_batch_size):
            part = kb[start : start + self.config.max_batch_size]
            out += self._exists_part(pool, part, deadline)
        return out

    @staticmethod
    def _exists_part(pool: ServerPool[Any], part: list[bytes], deadline: float) -> list[bool]:
        result: list[bool] = pool.run(lambda s: s.exists(part), deadline)
        return result

    def batch_put_views(
        self, items: Iterable[Item], *, timeout: float | None = None
    ) -> list[ItemResult]:
        """Store `(key, buffer_or_address, length)` items, read in place from the caller's memory.

        The memory must stay alive and unchanged until the call returns. Items whose
        member missed the deadline are `TRANSPORT` results with `timed_out` (stored or not).
        """
        keys: list[bytes] = []
        views: list[memoryview] = []
        for key, buf, length in as_tuples(items, 3, "(key, buffer_or_address, length)", "put"):
            k = as_key(key)
            self._check_value_len(check_count("length", length, f"key {k[:40]!r}"), k)
            keys.append(k)
            views.append(as_view(buf, length, writable=False))

        def op(session: Any, chunk: list[int]) -> list[ItemResult]:
            codes = session.put([(keys[i], views[i]) for i in chunk])
            return [result_from_status(c) for c in codes]

        sizes = [len(v) for v in views]
        return self._batch(keys, sizes, op, self._deadline(timeout, sum(sizes)))

    def batch_get_into(
        self, items: Iterable[Item], *, timeout: float | None = None
    ) -> list[ItemResult]:
        """Read `(key, buffer_or_address, length)` items into the caller's memory.

        Full length or miss: an item is OK only if the stored value is exactly `length`
        bytes; otherwise it is a MISS and its buffer content is unspecified. An item
        whose member missed the deadline is a `TRANSPORT` result with `timed_out`, one
        on a member marked down has `member_down`: not a miss, the value may be there.
        """
        keys: list[bytes] = []
        views: list[memoryview] = []
        for key, buf, length in as_tuples(items, 3, "(key, buffer_or_address, length)", "get"):
            k = as_key(key)
            keys.append(k)
            views.append(as_view(buf, length, writable=True))
        sizes = [len(v) for v in views]
        return self._get_into(keys, views, self._deadline(timeout, sum(sizes)))

    def _get_into(
        self, keys: list[bytes], views: list[memoryview], deadline: float
    ) -> list[ItemResult]:
        def op(session: Any, chunk: list[int]) -> list[ItemResult]:
            pairs = session.get_into([(keys[i], views[i]) for i in chunk])
            return [result_from_status(c, n) for c, n in pairs]

        return self._batch(keys, [len(v) for v in views], op, deadline)

    def batch_xfer(
        self, items: Iterable[XferItem], is_write: bool, *, timeout: float | None = None
    ) -> list[ItemResult]:
        """Move `(key, address, length, value_offset)` items with one-sided RDMA.

        The server drives the transfer (RDMA READ from the caller's memory for a write,
        RDMA WRITE into it for a read) against memory given to `register_region`;
        the TCP connection carries only control messages. **RDMA only**: there is no
        TCP fallback (the address may be device memory), so without RDMA every item
        is a `transport` result whose cause starts with `"RDMA required"`.

        * Read (`is_write=False`): bytes `[value_offset, +length)` of the stored
          value. `miss` if absent or shorter than `value_offset + length`.
        * Write: the items of one key are the pieces of one new value; they must
          cover `[0, value length)` exactly. The value replaces the old one once
          every piece has arrived, and all its pieces share one result.

        Raises `LocalProtocolError` for a bad key, address, length or offset, write
        pieces that do not tile their value, or memory outside registered regions.
        """
        keys: list[bytes] = []
        wire: list[tuple[bytes, int, int, int]] = []
        shape = "(key, address, length, value_offset)"
        for key, addr, length, offset in as_tuples(items, 4, shape, "batch_xfer"):
            k = as_key(key)
            for name, v in (("address", addr), ("length", length), ("value_offset", offset)):
                check_count(name, v, f"batch_xfer: key {k[:40]!r}")
            self._check_value_len(offset + length, k)
            keys.append(k)
            wire.append((k, addr, length, offset))
        if is_write:
            try:
                p.xfer_pieces([(k, offset, n, 0, 0) for k, _, n, offset in wire])
            except p.FrameError as exc:
                raise LocalProtocolError(f"batch_xfer: {exc}") from None
        self._check_open()
        if self._rdma is None:
            cause = f"RDMA required: batch_xfer has no TCP fallback ({self._no_rdma})"
            return [ItemResult(ResultKind.TRANSPORT, cause)] * len(keys)
        for k, addr, n, _ in wire:
            if n and self._rdma.find(addr, n) is None:
                raise LocalProtocolError(
                    f"batch_xfer: [{addr:#x}, +{n}) for key {k[:40]!r} is not inside a "
                    "registered region; call register_region first"
                )

        def op(session: Any, chunk: list[int]) -> list[ItemResult]:
            if not session.rdma:
                cause = f"RDMA required: {session.address} serves no RDMA (no TCP fallback)"
                return [ItemResult(ResultKind.TRANSPORT, cause)] * len(chunk)
            pairs = session.xfer([wire[i] for i in chunk], is_write)
            return [result_from_status(c, n) for c, n in pairs]

        sizes = [w[2] for w in wire]
        deadline = self._deadline(timeout, sum(sizes))
        return self._batch(keys, sizes, op, deadline, keep_keys_together=is_write)

    def put(self, key: bytes | str, data: BufferOrAddress, *, timeout: float | None = None) -> None:
        """Store one value; raises on failure."""
        if isinstance(data, int):
            raise LocalProtocolError("put() takes a buffer; use batch_put_views for addresses")
        try:
            nbytes = memoryview(data).nbytes
        except TypeError:
            raise LocalProtocolError(
                f"invalid value of type {type(data).__name__!r}: pass a buffer"
            ) from None
        (r,) = self.batch_put_views([(key, data, nbytes)], timeout=timeout)
        self._raise_for(r)

    def get(self, key: bytes | str, *, timeout: float | None = None) -> bytes | None:
        """Read one value, or None if absent; `timeout` bounds the whole call."""
        k = as_key(key)
        deadline = self._deadline(timeout)
        for _ in range(8):  # a concurrent overwrite may change the size between the two calls
            n = self._size(k, deadline)
            if n is None:
                return None
            buf = bytearray(n)
            allowance = n / _MIN_RATE if timeout is None else 0.0
            (r,) = self._get_into([k], [memoryview(buf)], deadline + allowance)
            if r.ok:
                return bytes(buf)
            if r.kind is not ResultKind.MISS:
                self._raise_for(r)
        return None

    def size(self, key: bytes | str, *, timeout: float | None = None) -> int | None:
        """Length of the stored value, or None if absent."""
        return self._size(as_key(key), self._deadline(timeout))

    def _size(self, k: bytes, deadline: float) -> int | None:
        pool = self._pools[self._router.route(k)]
        ((status, n),) = pool.run(lambda s: s.size([k]), deadline)
        if status == Status.OK:
            return int(n)
        if status == Status.NOT_FOUND:
            return None
        raise error_from_status(Status(status), f"size({k!r})")

    def delete(self, key: bytes | str, *, timeout: float | None = None) -> bool:
        """Remove a value; True if it existed."""
        k = as_key(key)
        pool = self._pools[self._router.route(k)]
        (status,) = pool.run(lambda s: s.delete([k]), self._deadline(timeout))
        return bool(status == Status.OK)

    def servers(self) -> list[str]:
        """The configured servers, in configuration order."""
        return list(self.config.servers)

    def has_rdma(self) -> bool:
        """Whether this client moves data over RDMA (False means TCP)."""
        return self._rdma is not None

    def warmup(self, *, timeout: float | None = None) -> list[str]:
        """Connect to every server now; return the servers that could not be reached."""
        self._check_open()
        deadline = self._deadline(timeout)

        def probe(pool: ServerPool[Any]) -> Callable[[], bool]:
            return lambda: pool.run(lambda s: s.exists([]) == [], deadline)  # a round trip

        failed = []
        for pool, outcome in zip(
            self._pools, self._run_all([probe(pl) for pl in self._pools]), strict=True
        ):
            if isinstance(outcome, BaseException):
                log.warning("memkv: warmup: %s", outcome)
                failed.append(pool.address)
        return failed

    def register_region(self, addr: int, length: int) -> None:
        """Declare host memory that will be used as a source/target (RDMA registers it)."""
        check_count("address", addr, "register_region")
        check_count("length", length, "register_region")
        if self._rdma is not None:
            self._rdma.register_region(addr, length)

    def deregister_region(self, addr: int, length: int | None = None) -> None:
        """Forget a region registered with `register_region`; call before freeing it.

        `length` is accepted for the vendor's `deregister_region(addr, length)` form;
        the region is identified by `addr`.
        """
        check_count("address", addr, "deregister_region")
        if length is not None:
            check_count("length", length, "deregister_region")
        if self._rdma is not None:
            self._rdma.deregister_region(addr)

    def stats(self, server: str | int = 0, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's statistics (lanes, capacity, counters)."""
        pool = self._pools[self._server_index(server)]
        result: dict[str, Any] = pool.run(lambda s: s.stats(), self._deadline(timeout))
        return result

    def member_health(self) -> list[MemberHealth]:
        """Each configured server's up/down state and counters, in configuration order."""
        return [pool.health.snapshot() for pool in self._pools]

    def close(self) -> None:
        """Close every connection; the client cannot be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pool in self._pools:
            pool.close()
        self._executor.shutdown(wait=True)
        if self._rdma is not None:
            self._rdma.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _raise_for(r: ItemResult) -> None:
        if r.ok:
            return
        if r.kind is ResultKind.TRANSPORT:
            raise TransportError(r.cause)
        status = Status.NOT_FOUND if r.kind is ResultKind.MISS else Status.SERVER_ERROR
        name = r.cause.split(":", 1)[0]
        if name in Status.__members__:
            status = Status[name]
        raise error_from_status(status, r.cause)
