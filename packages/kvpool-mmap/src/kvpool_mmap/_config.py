"""Configuration: frozen dataclasses validated on construction, and the derived geometry."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from kv_eviction import validate_policy
from kv_offload_settings import Setting, checked_fields, setting, settings_of, unknown_keys_message

from ._errors import ConfigError

MAX_TIER_BYTES = 1 << 60
"""Largest byte budget (1 EiB): every file offset must fit a signed 64-bit integer."""

PAGE = 4096
"""Alignment of every data region (O_DIRECT and DMA friendly)."""

MAX_KEY_BYTES = 128
"""Longest key a slot header can hold (block hash plus group id fit easily)."""

HEADER_BYTES = 256
"""Bytes of one L2 slot header (its format is in `_codec.py`)."""

FsyncMode = Literal["batch", "always", "never"]
DirectIO = Literal["auto", "on", "off"]
L1Overflow = Literal["drop_unwritten", "demote"]

FSYNC_MODES: tuple[FsyncMode, ...] = get_args(FsyncMode)
DIRECT_IO_MODES: tuple[DirectIO, ...] = get_args(DirectIO)
L1_OVERFLOW_MODES: tuple[L1Overflow, ...] = get_args(L1Overflow)
MAX_IO_THREADS = 256
MIN_FSYNC_INTERVAL_S = 0.001
"""Shortest period of the background fdatasync (a shorter one only burns a core)."""


def round_up(n: int, to: int) -> int:
    """Smallest multiple of `to` that is >= n."""
    return -(-n // to) * to


def check_pool_path(value: object, setting: str) -> str:
    """`value` as a directory path for pool files, or ConfigError naming `setting`.

    The path must be absolute: every process of an engine (scheduler, workers) must
    name the same directory whatever its working directory is.
    """
    path: str | os.PathLike[str] = settings_of(TierConfig)["path"].check(
        value, setting, ConfigError
    )
    return os.fspath(path)


@dataclass(frozen=True)
class TierConfig:
    """One tier: a directory and the byte budget of the whole server for it."""

    path: str | os.PathLike[str] = setting(
        "path", "Directory of this tier's files (created if its parent exists)."
    )
    bytes_to_use: int = setting(
        "bytes",
        "Bytes for the whole server, split evenly over dp_size x tp_size ranks.",
        maximum=MAX_TIER_BYTES,
    )

    def validate(self, name: str, key: Callable[[str], str] = str) -> None:
        """Raise ConfigError naming `key(name.<setting>)` if a value is out of range."""
        checked_fields(self, lambda field: key(f"{name}.{field}"), ConfigError)


@dataclass(frozen=True)
class StoreConfig:
    """Everything the store and the per-rank L1 files need; identical in every process.

    Each setting is declared once, below; `store_settings()` lists them (with `l1.path`,
    `l1.bytes_to_use`, `l2.path` and `l2.bytes_to_use` for the tiers).
    """

    stride: int = setting(
        "int",
        "Bytes of one block in one tensor-parallel rank's file (one slot).",
        maximum=MAX_TIER_BYTES,
    )
    engine_id: str = setting(
        "name", "Names this engine's files; engines sharing a directory need distinct ids."
    )
    fingerprint: bytes = setting(
        "any",
        "Layout fingerprint (model, dtype, block size ...); L2 written under another is wiped.",
        accepts="bytes (a string is encoded)",
    )
    l1: TierConfig = setting("any", "The memory tier, typically a directory under /dev/shm.")
    l2: TierConfig | None = setting("any", "The optional disk tier; None disables it.", None)
    dp_size: int = setting("int", "Data-parallel engines sharing the budgets.", 1)
    tp_size: int = setting(
        "int", "Tensor-parallel ranks per engine; one file per rank and tier.", 1
    )
    dp_rank: int = setting("int", "This engine's data-parallel rank (< dp_size).", 0, minimum=0)
    eviction_policy: str = setting(
        "text",
        "Eviction policy of each tier (kv_eviction.make_policy); `auto` is never "
        "below LRU on the shipped traces.",
        "auto",
        accepts="a policy name registered with kv-eviction (auto, lru, marconi, ...)",
    )
    eviction_options: Mapping[str, Any] = setting(
        "any",
        "Keyword options of the eviction policy; kv-eviction validates them.",
        {},
        accepts="a mapping of the policy's option names to values",
    )
    admission_threshold: int = setting(
        "int",
        "A block's key must be seen this many times before it is stored (1 admits "
        "everything; raise it to keep one-shot prompts out).",
        1,
    )
    admission_max_entries: int = setting(
        "int", "Bound on keys the admission tracker remembers.", 1_000_000
    )
    io_threads: int = setting(
        "int",
        "Threads writing to L2; promotions from L2 have their own pool of this size.",
        4,
        maximum=MAX_IO_THREADS,
    )
    max_inflight_io: int = setting(
        "int",
        "Most background L2 writes queued at once (bounds how long a demotion or a "
        "disk read waits behind them).",
        64,
    )
    write_through: bool = setting(
        "bool", "Copy committed blocks to L2 in the background, so L2 survives a restart.", True
    )
    write_through_queue: int = setting(
        "int",
        "Most committed blocks waiting for write-through; beyond it they wait for demotion.",
        65536,
    )
    l2_fsync: FsyncMode = setting(
        "choice",
        "`always`: fdatasync after payload and header (slow); `batch`: every "
        "fsync_interval_s and on close (torn slots are caught by checksums); `never`: on "
        "close only.",
        "batch",
        choices=FSYNC_MODES,
    )
    fsync_interval_s: float = setting(
        "number",
        "Period of the background fdatasync in `batch` mode.",
        1.0,
        minimum=MIN_FSYNC_INTERVAL_S,
    )
    direct_io: DirectIO = setting(
        "choice",
        "O_DIRECT for L2 payloads: `auto` when the stride is page aligned and the "
        "filesystem accepts it; `on` requires it; `off` uses the page cache.",
        "auto",
        choices=DIRECT_IO_MODES,
    )
    verify_on_open: bool = setting(
        "bool",
        "Read every L2 payload at start and drop slots whose checksum fails (slow).",
        False,
    )
    l1_overflow: L1Overflow = setting(
        "choice",
        "A full L1 in front of L2: `demote` demotes every victim without an L2 copy "
        "and stores no new block until a slot frees; `drop_unwritten` keeps storing and "
        "drops victims whose L2 write would have to wait (kvpool-mmap's README, Overloaded L1).",
        "demote",
        choices=L1_OVERFLOW_MODES,
    )
    names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """The user's key for each setting (e.g. a plugin's `cpu_bytes_to_use` for
    `l1.bytes_to_use`), used in every error message; absent ones keep their own name."""

    def key(self, name: str) -> str:
        """How the user spells setting `name` (in error messages)."""
        return self.names.get(name, name)

    def __post_init__(self) -> None:
        checked_fields(self, self.key, ConfigError)
        if not isinstance(self.fingerprint, bytes | bytearray):
            raise ConfigError(f"fingerprint must be bytes, got {type(self.fingerprint).__name__}")
        if not isinstance(self.l1, TierConfig):
            raise ConfigError("l1 must be a TierConfig")
        self.l1.validate("l1", self.key)
        if self.l2 is not None:
            if not isinstance(self.l2, TierConfig):
                raise ConfigError("l2 must be a TierConfig or None")
            self.l2.validate("l2", self.key)
        if not self.dp_rank < self.dp_size:
            raise ConfigError(
                f"dp_rank must be in [0, dp_size={self.dp_size}), got {self.dp_rank!r}"
            )
        try:
            validate_policy(self.eviction_policy, self.eviction_options)
        except ValueError as exc:
            raise ConfigError(
                f"{self.key('eviction_policy')} / {self.key('eviction_options')}: {exc}"
            ) from exc
        per_rank = self.dp_size * self.tp_size
        if self.l1.bytes_to_use // per_rank < self.stride:
            raise ConfigError(
                f"{self.key('l1.bytes_to_use')}={self.l1.bytes_to_use} holds no slot of "
                f"stride={self.stride} per rank after splitting over dp_size*tp_size={per_rank}"
            )
        if self.l2 is not None and self.l2.bytes_to_use // per_rank < self.l2_slot_bytes:
            raise ConfigError(
                f"{self.key('l2.bytes_to_use')}={self.l2.bytes_to_use} holds no slot of "
                f"{self.l2_slot_bytes} bytes per rank after splitting over {per_rank} ranks"
            )

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], names: Mapping[str, str] | None = None
    ) -> StoreConfig:
        """Build from plain data (e.g. a JSON file); rejects unknown keys.

        The tiers are given nested (`"l1": {"path": ..., "bytes_to_use": ...}`) or as
        `l1.path`, `l1.bytes_to_use`, ... (as `store_settings()` names them); `names`
        are the user's keys for errors (see `names`).
        """
        names_given = dict(data.get("names") or {})
        values = {k: v for k, v in data.items() if "." not in k}
        for dotted in sorted(k for k in data if "." in k):
            tier, _, setting_name = dotted.partition(".")
            if tier in ("l1", "l2") and isinstance(values.get(tier, {}), Mapping):
                values[tier] = {**values.get(tier, {}), setting_name: data[dotted]}
            else:
                values[dotted] = data[dotted]
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ConfigError(unknown_keys_message(unknown, store_settings()))
        for tier in ("l1", "l2"):
            raw = values.get(tier)
            if isinstance(raw, Mapping):
                extra = sorted(set(raw) - {"path", "bytes_to_use"})
                if extra:
                    raise ConfigError(
                        f"{tier}: {unknown_keys_message(extra, ('path', 'bytes_to_use'))}"
                    )
                values[tier] = TierConfig(**raw)
        if isinstance(values.get("fingerprint"), str):
            values["fingerprint"] = values["fingerprint"].encode()
        values["names"] = {**names_given, **(names or {})}
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


def store_settings() -> dict[str, Setting]:
    """Every store setting by name, the tiers' as `l1.path`, `l1.bytes_to_use`, ..."""
    out = {k: v for k, v in settings_of(StoreConfig).items() if k not in ("l1", "l2")}
    for tier in ("l1", "l2"):
        for part, declared in settings_of(TierConfig).items():
            name = f"{tier}.{part}"
            out[name] = dataclasses.replace(declared, name=name)
            if tier == "l2":
                out[name] = dataclasses.replace(out[name], optional=True, default=None)
    return out


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
