"""The connector's configuration: `kv_connector_extra_config`, validated once.

Every key of the seed contract is accepted; any other key is an error (a typo must not
silently fall back to a default). Errors name the key and the accepted values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kv_offload_settings
from kv_eviction import validate_policy
from kv_offload_settings import read_config_file, unknown_keys_message
from kvpool_mmap import L1Overflow, Setting, expose, setting, settings_of, store_settings

from .log import logger

DEFAULT_CPU_BYTES = 8 << 30
LOAD_MODES = ("auto", "async", "same_step", "layer_wise")
COPY_PATHS = ("async", "direct", "async-per-layer", "generic")
DEFAULT_STAGING_BYTES = 2560 << 20
"""Stores: a 16k-token prefill chunk of an 8B model (2 GiB); loads: four 128 MiB chunks."""
EVICTION_ALIASES = {"eviction_decay": "decay", "eviction_reuse_mode": "reuse_mode"}
"""The seed's flat keys: aliases of the `marconi` policy's options in `eviction_options`
(with another policy they are ignored, with a warning: `ignored_keys`)."""
_STORE = store_settings()
CONFIG_FILE_ENV = "MARCONI_OFFLOAD_CONFIG"
"""Names a YAML file of connector settings when `config_file` is not set."""
ENV_UNITS = {"staging_bytes": "MiB"}
"""The unit of a bare number in a setting's environment variable (`Setting.env`, read
where neither `kv_connector_extra_config` nor the config file sets the key)."""


class ConfigError(kv_offload_settings.ConfigError):
    """A `kv_connector_extra_config` value is invalid; the message names the key (and the
    file or variable that gave it, if not the inline config)."""


@dataclass(frozen=True)
class OffloadConfig:
    """Validated connector settings, each declared once here or (store settings) in
    kvpool-mmap, exposed under the connector's key.

    `cpu_bytes_to_use` and `l2_bytes_to_use` are totals for the server; the store divides
    them by data-parallel size and tensor-parallel size.
    """

    cpu_pool_path: str | None = expose(
        _STORE["l1.path"],
        default=None,
        optional=True,
        doc="Directory of the L1 files (a tmpfs such as /dev/shm for RAM speed); not set: a "
        "private tmpfs pool whose file names are removed once every vLLM process has it "
        "mapped, so nothing is left behind however the server exits.",
    )
    cpu_bytes_to_use: int = expose(
        _STORE["l1.bytes_to_use"],
        default=DEFAULT_CPU_BYTES,
        doc="L1 budget for the whole server, divided by data-parallel x tensor-parallel "
        "size (at least one block per rank); reserved up front: a tmpfs too small fails at "
        "startup, never with SIGBUS later.",
    )
    l2_pool_path: str | None = expose(
        _STORE["l2.path"],
        doc="Directory of the disk tier, set together with `l2_bytes_to_use`; omit both to "
        "run single-tier.",
    )
    l2_bytes_to_use: int = expose(
        _STORE["l2.bytes_to_use"],
        default=0,
        minimum=0,
        optional=False,
        doc="L2 budget for the whole server (at least one block per rank), set together "
        "with `l2_pool_path`.",
    )
    eviction_policy: str = expose(
        _STORE["eviction_policy"],
        doc="`auto` (self-tuning; why it is the default: see below), `lru` and `marconi` (the "
        "seed's, unchanged), `doorkeeper-lru`, `doorkeeper-lfu-decay-1`, `probation-lru`, or "
        "one registered with `kv_eviction.register_policy`.",
    )
    eviction_options: Mapping[str, Any] = expose(
        _STORE["eviction_options"],
        doc="Checked by `kv_eviction.validate_policy`. `marconi`: `decay`, `reuse_mode`; "
        "`auto`: its tuning knobs (`sample_budget`, `sample_entries`, `min_epoch`, ...; the "
        "defaults need no change); `lru` and the named rules: none.",
    )
    """Options of `eviction_policy`, the flat aliases folded in; kv-eviction validated both."""
    admission_threshold: int = expose(_STORE["admission_threshold"])
    l1_overflow: L1Overflow = expose(_STORE["l1_overflow"])
    load_mode: str = setting(
        "choice",
        "When a hit's blocks reach the GPU: `same_step` (the request joins the batch at once "
        "and the step's forward waits for the load, which the GPU's copy engine moves), "
        "`layer_wise` (as `same_step`, but kernels on the GPU's cores read the load layer by "
        "layer and each attention layer vLLM runs eagerly waits only for its own layer), "
        "`auto` (at start each worker times both on a wave of this model's blocks and keeps "
        "`layer_wise` unless its rate is under 0.85x the copy engine's; one `load_mode auto:` "
        "line gives both rates and the choice; CPU workers copy synchronously: `same_step`) "
        "or `async` (the request waits out of the batch until its load has landed). Models "
        "with state (Mamba, linear-attention) groups always load `async`.",
        "auto",
        choices=LOAD_MODES,
    )
    copy_path: str = setting(
        "choice",
        "How a CUDA worker moves blocks (see GPU data path below); `generic` is what CPU "
        "vLLM and a non-page-lockable L1 use.",
        "async",
        choices=COPY_PATHS,
        env="VLLM_MARCONI_OFFLOAD_COPY",
    )
    staging_bytes: int | None = setting(
        "bytes",
        "GPU memory for the staging buffers of the chunked DMA (loads take up to 512 MiB, "
        "stores the rest; not set: 2.5 GiB), allocated outside vLLM's KV budget: leave room "
        "for it in `--gpu-memory-utilization`. Its variable counts MiB.",
        None,
        optional=True,
        env="VLLM_MARCONI_OFFLOAD_STAGING_MIB",
    )
    pcie_programs_per_sm: int = setting(
        "int",
        "Programs per SM of the kernels that read or write L1 over PCIe: enough to keep the "
        "link busy, few enough to leave the SMs to the forward beside them.",
        1,
        env="VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM",
    )
    hit_log_interval: int = setting(
        "int", "Log a `[CPU-OFFLOAD HIT]` line every this many finished lookups.", 10
    )
    l2_read_bytes_per_s: float = setting(
        "number",
        "L2 read throughput (bytes/s) assumed until promotions have measured it: decides "
        "whether an L2 hit is cheaper to load than to recompute (see Load or recompute).",
        1.5e9,
        minimum=1.0,
    )
    prefill_tokens_per_s: float = setting(
        "number",
        "Prefill throughput (tokens/s) assumed until the scheduler has measured it; `0` means "
        "unknown: L2 hits are loaded until a prefill has been timed.",
        0.0,
        minimum=0.0,
    )
    pool_name: str | None = expose(
        _STORE["engine_id"],
        default=None,
        optional=True,
        doc="Names the pool files, used as given; not set: the model's name and a digest of "
        "model, weights and layout, stable across restarts. Two servers of one model sharing "
        "a directory need different names (the second is refused at start).",
    )
    l2_fsync: str = expose(_STORE["l2_fsync"])
    direct_io: str = expose(_STORE["direct_io"])
    io_threads: int = expose(_STORE["io_threads"])
    verify_on_open: bool = expose(
        _STORE["verify_on_open"],
        doc="Read and checksum every L2 block at start, dropping bad ones (slow; every load "
        "is verified anyway).",
    )
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The keys as the user gave them."""
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each key not given inline came from (`path: `), for error messages."""

    def where(self, key: str) -> str:
        """`<file>: ` if the config file gave `key`, else "" (the prefix of an error)."""
        return self.origins.get(key, "")

    @property
    def has_l2(self) -> bool:
        return self.l2_pool_path is not None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> OffloadConfig:
        """Validate `kv_connector_extra_config` (over the keys of its `config_file`, or of
        the file `MARCONI_OFFLOAD_CONFIG` names) and build the settings."""
        inline = dict(extra or {})
        path = inline.pop("config_file", None) or os.environ.get(CONFIG_FILE_ENV) or None
        from_file = _read_config_file(path) if path is not None else {}
        merged = {**from_file, **inline}
        from_env = _from_environment(merged)

        def where(*keys: str) -> str:  # the file or variable, if it gave all these keys
            if len(keys) == 1 and keys[0] in from_env:
                variable = SETTINGS[keys[0]].env
                return f"{variable}={os.environ[variable]!r}: "
            return f"{path}: " if path and all(k not in inline for k in keys) else ""

        _check_keys(inline, "kv_connector_extra_config")
        values = {}
        for name, declared in settings_of(cls).items():
            try:
                values[name] = declared.check(
                    merged.get(name, from_env.get(name, declared.default))
                )
            except kv_offload_settings.ConfigError as exc:
                raise ConfigError(f"{where(name)}{exc}") from None
        if values["l2_pool_path"] is None and values["l2_bytes_to_use"]:
            raise ConfigError(
                f"{where('l2_bytes_to_use')}l2_bytes_to_use is set but l2_pool_path is not; "
                "set both or neither"
            )
        if values["l2_pool_path"] is not None and not values["l2_bytes_to_use"]:
            raise ConfigError(
                f"{where('l2_pool_path')}l2_pool_path is set: l2_bytes_to_use must be a "
                "positive byte count"
            )
        try:
            values["eviction_policy"], values["eviction_options"] = _eviction(merged)
        except ConfigError as exc:
            keys = (*EVICTION_ALIASES, "eviction_policy", "eviction_options")
            raise ConfigError(f"{where(*(k for k in keys if k in merged))}{exc}") from None
        origins = {name: where(name) for name in settings_of(cls) if name in merged}
        config = cls(**values, extra=merged, origins=origins)
        config.warn_ignored_keys()
        return config

    def store_values(self) -> dict[str, Any]:
        """The kvpool-mmap settings the user set, by kvpool-mmap's names."""
        return {
            declared.store_name: getattr(self, name)
            for name, declared in settings_of(OffloadConfig).items()
            if declared.store_name
            and getattr(self, name) is not None
            and (self.has_l2 or not declared.store_name.startswith("l2."))
        }

    def ignored_keys(self) -> list[str]:
        """Keys the user set that this configuration does not use."""
        ignored = []
        if self.eviction_policy != "marconi":
            ignored += [k for k in _MARCONI_KEYS if k in self.extra]
        if not self.has_l2:
            ignored += [k for k in _L2_KEYS if k in self.extra]
        return ignored

    def warn_ignored_keys(self) -> None:
        """Log a warning for every key that has no effect here (a misunderstanding the
        user should hear about, not an error)."""
        for key in self.ignored_keys():
            reason = (
                f"eviction_policy={self.eviction_policy!r} takes no Marconi options"
                if key in _MARCONI_KEYS
                else "there is no L2 (l2_pool_path is not set)"
            )
            logger.warning("kv_connector_extra_config: %s is ignored: %s", key, reason)


_CONFIG_FILE = Setting(
    "text",
    "A YAML file of these keys (inline keys win); not set: the file its variable names, if any.",
    None,
    accepts="a path to a YAML file",
    name="config_file",
    env=CONFIG_FILE_ENV,
)
_ALIASES = {
    "eviction_decay": Setting(
        "any",
        'Alias of `eviction_options["decay"]` with `marconi`: exponential decay of a '
        "block's score per scheduler step (finite, >= 0; marconi's default 0.0); ignored, with "
        "a warning, with another policy.",
        None,
        accepts="a number >= 0",
        name="eviction_decay",
    ),
    "eviction_reuse_mode": Setting(
        "any",
        'Alias of `eviction_options["reuse_mode"]` with `marconi`: how hits count (hit '
        "count, log1p of it, or not at all; marconi's default `linear`); ignored, with a "
        "warning, with another policy.",
        None,
        accepts="one of ['linear', 'log', 'none']",
        name="eviction_reuse_mode",
    ),
}
SETTINGS: dict[str, Setting] = {
    **settings_of(OffloadConfig),
    **_ALIASES,
    "config_file": _CONFIG_FILE,
}
"""Every key of `kv_connector_extra_config`, declared once."""
USER_KEYS = {s.store_name: key for key, s in SETTINGS.items() if s.store_name}
"""The user's key of each kvpool-mmap setting the connector exposes (for its errors)."""
_MARCONI_KEYS = tuple(EVICTION_ALIASES)
_L2_KEYS = ("l2_fsync", "direct_io", "verify_on_open", "l2_read_bytes_per_s", "l1_overflow")


def _check_keys(values: Mapping[str, Any], where: str) -> None:
    """ConfigError naming `where` and the keys of `values` that are no setting."""
    unknown = sorted(set(values) - set(SETTINGS) - {"config_file"})
    if unknown:
        raise ConfigError(f"{where}: {unknown_keys_message(unknown, SETTINGS)}")


def _from_environment(given: Mapping[str, Any]) -> dict[str, str]:
    """The settings that `given` lacks and whose variable (`Setting.env`) is set, as text
    (a bare number gets the unit of `ENV_UNITS`)."""
    values = {}
    for key, declared in settings_of(OffloadConfig).items():
        text = os.environ.get(declared.env, "").strip() if declared.env else ""
        unit = ENV_UNITS.get(key, "")
        if key not in given and text:
            values[key] = f"{text}{unit}" if unit and text.isdigit() else text
    return values


def _read_config_file(path: str) -> dict[str, Any]:
    """The settings in the YAML file `path`; ConfigError naming the file otherwise."""
    try:
        data = read_config_file(path)
    except kv_offload_settings.ConfigError as exc:
        raise ConfigError(f"config_file {exc}") from None
    _check_keys(data, path)
    if "config_file" in data:
        raise ConfigError(f"{path}: config_file cannot name another file")
    return data


def _eviction(extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """`eviction_policy` and its options (marconi's flat aliases folded in), checked by
    kv-eviction.

    kv-eviction's registry is the one list of policies and options: a policy registered
    there (`kv_eviction.register_policy`) is configurable here without an edit.
    """
    policy = extra.get("eviction_policy", SETTINGS["eviction_policy"].default)
    raw = extra.get("eviction_options", {})
    if not isinstance(raw, Mapping):
        raise ConfigError(f"eviction_options must be a mapping of option names, got {raw!r}")
    options = dict(raw)
    keys = ["eviction_policy", *(["eviction_options"] if "eviction_options" in extra else [])]
    for key, option in EVICTION_ALIASES.items():
        if key not in extra or policy != "marconi":
            continue
        if option in options:
            raise ConfigError(f"{key} and eviction_options[{option!r}] both set; set one")
        options[option] = extra[key]
        keys.append(key)
    try:
        validate_policy(policy, options)
    except ValueError as exc:
        raise ConfigError(f"{' / '.join(keys)}: {exc}") from None
    return str(policy), options
