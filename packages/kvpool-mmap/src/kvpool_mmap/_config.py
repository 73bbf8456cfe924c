"""Configuration: frozen dataclasses validated on construction, and the derived geometry."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kv_eviction import validate_policy

from ._errors import ConfigError

PAGE = 4096
"""Alignment of every data region (O_DIRECT and DMA friendly)."""

MAX_KEY_BYTES = 128
"""Longest key a slot header can hold (block hash plus group id fit easily)."""

HEADER_BYTES = 256
"""Bytes of one L2 slot header (its format is in `_codec.py`)."""

FsyncMode = Literal["batch", "always", "never"]
DirectIO = Literal["auto", "on", "off"]
L1Overflow = Literal["drop_unwritten", "demote"]

_ENGINE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
FSYNC_MODES: tuple[FsyncMode, ...] = ("batch", "always", "never")
DIRECT_IO_MODES: tuple[DirectIO, ...] = ("auto", "on", "off")
L1_OVERFLOW_MODES: tuple[L1Overflow, ...] = ("drop_unwritten", "demote")


def round_up(n: int, to: int) -> int:
    """Smallest multiple of `to` that is >= n."""
    return -(-n // to) * to


MAX_TIER_BYTES = 1 << 60
"""Largest byte budget (1 EiB): every file offset must fit a signed 64-bit integer."""

MAX_IO_THREADS = 256


def _positive_int(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(f"{name} must be an integer {bound}, got {value!r}")


def check_pool_path(value: object, setting: str) -> str:
    """`value` as a directory path for pool files, or ConfigError naming `setting`.

    The path must be absolute: every process of an engine (scheduler, workers) must
    name the same directory whatever its working directory is.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{setting} must be an absolute directory path, got {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise ConfigError(f"{setting} must be an absolute directory path, got {value!r}")
    if not os.path.isabs(text):
        raise ConfigError(
            f"{setting} must be an absolute directory path, got {text!r}: a relative path "
            "would name a different directory in each process (working directories differ)"
        )
    return text


@dataclass(frozen=True)
class TierConfig:
    """One tier: a directory and the byte budget of the whole server for it."""

    path: str | os.PathLike[str]
    """Absolute path of the directory holding this tier's files (created if its parent
    exists)."""
    bytes_to_use: int
    """Total bytes for the whole server, at most MAX_TIER_BYTES; split evenly over
    dp_size x tp_size ranks."""

    def validate(self, name: str) -> None:
        """Raise ConfigError naming `name.<setting>` if a value is out of range."""
        check_pool_path(self.path, f"{name}.path")
        _positive_int(f"{name}.bytes_to_use", self.bytes_to_use, maximum=MAX_TIER_BYTES)


@dataclass(frozen=True)
class StoreConfig:
    """Everything the store and the per-rank L1 files need; identical in every process."""

    stride: int
    """Bytes of one block in one tensor-parallel rank's file (one slot)."""
    engine_id: str
    """Names this engine's files; engines sharing a directory need distinct ids ([A-Za-z0-9_.-])."""
    fingerprint: bytes
    """Layout fingerprint (model, dtype, block size ...); L2 written under another is wiped."""
    l1: TierConfig
    """The memory tier, typically a directory under /dev/shm."""
    l2: TierConfig | None = None
    """The optional disk tier; None disables it."""
    dp_size: int = 1
    """Data-parallel engines sharing the budgets."""
    tp_size: int = 1
    """Tensor-parallel ranks per engine; one file per rank and tier."""
    dp_rank: int = 0
    """This engine's data-parallel rank (0 <= dp_rank < dp_size)."""
    eviction_policy: str = "auto"
    """Name passed to kv_eviction.make_policy (one policy per tier): any registered name;
    `auto` by default (never below LRU on the shipped traces, see the README)."""
    eviction_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options passed to kv_eviction.make_policy; kv-eviction validates both."""
    admission_threshold: int = 1
    """A key is stored once begin_store has seen it this many times."""
    admission_max_entries: int = 1_000_000
    """Bound on keys the admission tracker remembers."""
    io_threads: int = 4
    """Threads writing to L2 (write-through, demotion); promotions from L2 have their own
    pool of the same size, so a load never queues behind background writes."""
    max_inflight_io: int = 64
    """Most background write-throughs queued on the I/O threads at once (bounds how long a
    demotion or a disk read waits behind them)."""
    write_through: bool = True
    """Copy committed blocks to L2 in the background, so L2 survives a restart."""
    write_through_queue: int = 65536
    """Most committed blocks waiting for write-through; beyond it they wait for demotion."""
    l2_fsync: FsyncMode = "batch"
    """'always': fdatasync after payload and after header (each write durable, slow);
    'batch': fdatasync every fsync_interval_s and on close (a power loss can lose the last
    interval; torn slots are caught by checksums); 'never': only on close."""
    fsync_interval_s: float = 1.0
    """Period of the background fdatasync in 'batch' mode."""
    direct_io: DirectIO = "auto"
    """O_DIRECT for L2 payloads: 'auto' uses it when stride is page aligned and the
    filesystem accepts it; 'on' requires it; 'off' uses the page cache."""
    verify_on_open: bool = False
    """Read every L2 payload at start and drop slots whose checksum fails (slow; for checks)."""
    l1_overflow: L1Overflow = "demote"
    """How a full L1 shares work with a slower L2. 'demote' (the seed's design): victims
    without an L2 copy are always demoted; their slots free when the writes land, blocks
    that find no slot meanwhile are not stored (store_no_space), and a block found only in
    L2 is not stored into L1 again (L1 turns over no faster than the disk writes).
    'drop_unwritten': L1 works as it would alone: a block found only in L2 that is stored
    again gets an L1 slot (restores; its L2 copy stays), and victims without an L2 copy are
    demoted while background L2 writes are fewer than max_inflight_io, else dropped
    (dropped_unwritten), so a store never waits for the disk. Without L2 both are L1 alone."""

    def __post_init__(self) -> None:
        _positive_int("stride", self.stride, maximum=MAX_TIER_BYTES)
        if not isinstance(self.engine_id, str) or not _ENGINE_ID.match(self.engine_id):
            raise ConfigError(
                f"engine_id must match [A-Za-z0-9_.-]{{1,64}}, got {self.engine_id!r}"
            )
        if not isinstance(self.fingerprint, (bytes, bytearray)):
            raise ConfigError(f"fingerprint must be bytes, got {type(self.fingerprint).__name__}")
        _positive_int("dp_size", self.dp_size)
        _positive_int("tp_size", self.tp_size)
        if not isinstance(self.l1, TierConfig):
            raise ConfigError("l1 must be a TierConfig")
        self.l1.validate("l1")
        if self.l2 is not None:
            if not isinstance(self.l2, TierConfig):
                raise ConfigError("l2 must be a TierConfig or None")
            self.l2.validate("l2")
        if isinstance(self.dp_rank, bool) or not isinstance(self.dp_rank, int):
            raise ConfigError(f"dp_rank must be an integer, got {self.dp_rank!r}")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ConfigError(
                f"dp_rank must be in [0, dp_size={self.dp_size}), got {self.dp_rank!r}"
            )
        try:
            validate_policy(self.eviction_policy, self.eviction_options)
        except ValueError as exc:
            raise ConfigError(f"eviction_policy / eviction_options: {exc}") from exc
        _positive_int("admission_threshold", self.admission_threshold)
        _positive_int("admission_max_entries", self.admission_max_entries)
        _positive_int("io_threads", self.io_threads, maximum=MAX_IO_THREADS)
        _positive_int("max_inflight_io", self.max_inflight_io)
        _positive_int("write_through_queue", self.write_through_queue)
        if self.l2_fsync not in FSYNC_MODES:
            raise ConfigError(f"l2_fsync must be one of {FSYNC_MODES}, got {self.l2_fsync!r}")
        if self.direct_io not in DIRECT_IO_MODES:
            raise ConfigError(f"direct_io must be one of {DIRECT_IO_MODES}, got {self.direct_io!r}")
        if self.l1_overflow not in L1_OVERFLOW_MODES:
            raise ConfigError(
                f"l1_overflow must be one of {L1_OVERFLOW_MODES}, got {self.l1_overflow!r}"
            )
        for flag in ("write_through", "verify_on_open"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        interval = self.fsync_interval_s
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise ConfigError(f"fsync_interval_s must be a finite number > 0, got {interval!r}")
        per_rank = self.dp_size * self.tp_size
        if self.l1.bytes_to_use // per_rank < self.stride:
            raise ConfigError(
                f"l1.bytes_to_use={self.l1.bytes_to_use} holds no slot of stride={self.stride} "
                f"per rank after splitting over dp_size*tp_size={per_rank}"
            )
        if self.l2 is not None and self.l2.bytes_to_use // per_rank < self.l2_slot_bytes:
            raise ConfigError(
                f"l2.bytes_to_use={self.l2.bytes_to_use} holds no slot of "
                f"{self.l2_slot_bytes} bytes per rank after splitting over {per_rank} ranks"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoreConfig:
        """Build from plain data (e.g. vLLM's kv_connector_extra_config); rejects unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}; accepted: {sorted(names)}")
        values = dict(data)
        for tier in ("l1", "l2"):
            raw = values.get(tier)
            if isinstance(raw, Mapping):
                extra = sorted(set(raw) - {"path", "bytes_to_use"})
                if extra:
                    raise ConfigError(
                        f"unknown {tier} setting(s) {extra}; accepted: path, bytes_to_use"
                    )
                values[tier] = TierConfig(**raw)
        if isinstance(values.get("fingerprint"), str):
            values["fingerprint"] = values["fingerprint"].encode()
        try:
            return cls(**values)
        except TypeError as exc:  # a required setting is missing
            raise ConfigError(str(exc)) from exc

    # --- derived geometry -------------------------------------------------------------

    @property
    def ranks_per_server(self) -> int:
        """dp_size * tp_size: the number of ways each budget is split."""
        return self.dp_size * self.tp_size

    @property
    def l1_slots(self) -> int:
        """Slots in each L1 rank file."""
        return self.l1.bytes_to_use // self.ranks_per_server // self.stride

    @property
    def l2_payload_bytes(self) -> int:
        """Bytes of one L2 payload area: stride rounded up to a page."""
        return round_up(self.stride, PAGE)

    @property
    def l2_slot_bytes(self) -> int:
        """Bytes one L2 slot costs in a rank file: payload plus its header-table entry."""
        return self.l2_payload_bytes + HEADER_BYTES

    @property
    def l2_slots(self) -> int:
        """Slots in each L2 rank file (0 without L2)."""
        if self.l2 is None:
            return 0
        return self.l2.bytes_to_use // self.ranks_per_server // self.l2_slot_bytes

    def file_stem(self, tp_rank: int) -> str:
        """File name stem of one rank: engine id, dp rank and tp rank (never a GPU index)."""
        return f"kvpool-{self.engine_id}-dp{self.dp_rank}-tp{tp_rank}"

    def l1_file(self, tp_rank: int) -> Path:
        """Path of rank `tp_rank`'s L1 file."""
        return Path(self.l1.path) / f"{self.file_stem(tp_rank)}.l1"

    def l2_file(self, tp_rank: int) -> Path:
        """Path of rank `tp_rank`'s L2 file (requires l2)."""
        assert self.l2 is not None
        return Path(self.l2.path) / f"{self.file_stem(tp_rank)}.l2"

    def check_tp_rank(self, rank: int) -> None:
        """Raise ConfigError unless 0 <= rank < tp_size."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.tp_size:
            raise ConfigError(f"rank must be in [0, tp_size={self.tp_size}), got {rank!r}")


def prepare_dir(path: str | os.PathLike[str], setting: str) -> Path:
    """Create the tier directory if its parent exists; check it is a writable directory."""
    p = Path(path)
    if not p.exists():
        if not p.parent.is_dir():
            raise ConfigError(f"{setting}={str(p)!r}: neither it nor its parent directory exists")
        try:
            p.mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{setting}={str(p)!r}: cannot create directory: {exc}") from exc
    if not p.is_dir():
        raise ConfigError(f"{setting}={str(p)!r} is not a directory")
    probe = p / f".kvpool-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"{setting}={str(p)!r} is not writable: {exc}") from exc
    return p
