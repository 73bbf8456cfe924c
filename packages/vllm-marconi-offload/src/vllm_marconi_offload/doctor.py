"""`python -m vllm_marconi_offload doctor`: check this host before a server starts.

From the `kv_connector_extra_config` a server would take (inline, over `config_file` or
the file `MARCONI_OFFLOAD_CONFIG` names): vLLM's version, `PYTHONHASHSEED` (with L2), the
room for this host's L1 (`kvpool_mmap.check_l1_room`, as the server checks it at start)
and its filesystem, the locked-memory limit, the L2 directory's free space and O_DIRECT,
and the pool files already in the pool directories (in use by a live process, or left
by a stopped one). One host, every data-parallel rank on it. vLLM is not imported.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvpool_mmap import (
    InsufficientSpaceError,
    KvPoolError,
    check_l1_room,
    inspect_pool_file,
    pool_files,
)
from vllm_kv_identity.doctor import Check, doctor_parser, extra_config, human_bytes, report
from vllm_kv_identity.host_checks import (
    RAM_FILESYSTEMS,
    describe_place,
    filesystem_type,
    free_bytes,
    hash_seed_check,
    installed_vllm,
    memlock_check,
    o_direct_check,
    space_check,
    vllm_version_check,
)

from ._version import SUPPORTED_VLLM
from .config import CONFIG_FILE_ENV, ConfigError, OffloadConfig
from .pool import anonymous_l1_dirs, anonymous_l1_root

__all__ = ["doctor_checks", "main"]

PLUGIN = "vllm-marconi-offload"


def doctor_checks(extra: Mapping[str, Any], hash_algorithm: str | None = None) -> list[Check]:
    """Every check, in order, for a server given `extra` as `kv_connector_extra_config`
    in this environment (its config file, `PYTHONHASHSEED`, limits)."""
    installed = installed_vllm()
    checks = [vllm_version_check(PLUGIN, SUPPORTED_VLLM, installed)]
    try:
        config = OffloadConfig.from_extra_config(extra)
    except ConfigError as exc:
        checks.append(Check.fail(f"configuration: {exc}", "correct that value"))
        return checks
    checks.append(_config_check(config))
    checks += [_ignored_key(config, key) for key in config.ignored_keys()]
    if config.has_l2:
        version = installed[1] if installed else None
        seed = os.environ.get("PYTHONHASHSEED")
        checks.append(
            hash_seed_check(version, hash_algorithm, seed, "L2 will not hit after a restart")
        )
    else:
        checks.append(
            Check.ok("PYTHONHASHSEED: not needed without L2 (L1 lives as long as the server)")
        )
    checks += _l1_checks(config)
    checks.append(memlock_check(config.cpu_bytes_to_use, "pinning L1 for GPU copies", False))
    if config.l2_pool_path is not None:
        l2 = Path(config.l2_pool_path)
        checks.append(space_check(l2, config.l2_bytes_to_use, "l2_bytes_to_use"))
        if config.direct_io != "off":
            checks.append(o_direct_check(l2, "l2_pool_path", config.direct_io == "on"))
    for setting, folder in (("cpu_pool_path", config.cpu_pool_path), ("l2_pool_path", config.l2_pool_path)):  # fmt: skip
        if folder is not None:
            found = _pool_checks(Path(folder), setting, config.pool_name)
            checks += found or [Check.ok(f"{setting}: no pool files in {folder} yet")]
    if config.cpu_pool_path is None:  # private pools: only what dead engines left
        for private in anonymous_l1_dirs():
            checks += _pool_checks(private, "cpu_pool_path (not set)", config.pool_name)
    return checks


def _config_check(config: OffloadConfig) -> Check:
    source = config.extra.get("config_file") or os.environ.get(CONFIG_FILE_ENV)
    where = f" (with {source})" if source else ""
    l1 = config.cpu_pool_path or f"a private pool under {anonymous_l1_root()}"
    l2 = (
        f"{human_bytes(config.l2_bytes_to_use)} in {config.l2_pool_path}"
        if config.has_l2
        else "off"
    )
    return Check.ok(
        f"configuration{where}: valid; L1 {human_bytes(config.cpu_bytes_to_use)} in {l1}, L2 {l2}"
    )


def _ignored_key(config: OffloadConfig, key: str) -> Check:
    return Check.warn(
        f"configuration: {key} is ignored with this configuration (eviction_policy="
        f"{config.eviction_policy!r}, L2 {'on' if config.has_l2 else 'off'})",
        f"remove {key}, or set what it belongs to",
    )


def _l1_checks(config: OffloadConfig) -> list[Check]:
    """Room for this host's L1 files where they go, as the server checks it, and
    whether that place is RAM."""
    if config.cpu_pool_path:
        directory, also = Path(config.cpu_pool_path), []
    else:
        directory, also = anonymous_l1_root(), anonymous_l1_dirs()
    need = config.cpu_bytes_to_use
    try:
        check_l1_room(directory, need, "cpu_bytes_to_use", also=also)
        free = free_bytes(directory)
    except InsufficientSpaceError as exc:
        fix = "lower cpu_bytes_to_use or free space"
        if str(directory).startswith("/dev/shm"):
            size = -(-need // (1 << 30)) + 1  # GiB, with room for vLLM's own shared memory
            fix = (f"lower cpu_bytes_to_use or grow /dev/shm (mount -o remount,size={size}G "
                   f"/dev/shm; in Docker: docker run --shm-size={size}g)")  # fmt: skip
        finding = (exc.strerror or str(exc)).split("; lower ")[0]  # the fix follows
        return [Check.fail(finding, fix)]
    except OSError as exc:
        return [Check.fail(f"cpu_bytes_to_use: cannot read the free space of {directory}: "
                           f"{exc.strerror}", "choose another cpu_pool_path")]  # fmt: skip
    reclaimed = ""
    if free is not None and need > free:
        reclaimed = " once the L1 files of stopped engines are removed (at start)"
    checks = [Check.ok(f"cpu_bytes_to_use: {human_bytes(need)} fit in "
                       f"{describe_place(directory, free)}{reclaimed}")]  # fmt: skip
    kind = filesystem_type(directory)
    if kind not in RAM_FILESYSTEMS:
        checks.append(Check.warn(
            f"cpu_pool_path: {directory} is on {kind}, not RAM: L1 copies run at disk speed",
            "set cpu_pool_path to a tmpfs such as /dev/shm",
        ))  # fmt: skip
    return checks


def _pool_checks(directory: Path, setting: str, pool_name: str | None) -> list[Check]:
    """The pool files already in `directory`: ✖ if this server's (`pool_name`) is held by
    a live process, ⚠ for another server's in use here or an L1 file a stopped engine
    left, ✔ for an L2 file waiting for its server."""
    try:
        paths = pool_files(directory) if directory.is_dir() else []
    except OSError as exc:
        return [Check.fail(f"{setting}: cannot list {directory}: {exc.strerror}",
                           f"make {directory} readable, or choose another {setting}")]  # fmt: skip
    checks = []
    for path in paths:
        try:
            info = inspect_pool_file(path)
        except (KvPoolError, OSError) as exc:
            checks.append(Check.warn(f"{setting}: {path} cannot be read ({exc})", f"remove {path}"))
            continue
        mine = pool_name is not None and path.name.startswith(f"kvpool-{pool_name}-dp")
        if info.owners and mine:
            checks.append(Check.fail(
                f"{setting}: {path} is in use by {info.owner}",
                "stop that server, or give this one its own pool_name",
            ))  # fmt: skip
        elif info.owners:
            checks.append(Check.warn(
                f"{setting}: {path} is in use by {info.owner}: a server of the same model "
                "here is refused",
                "give each server on this directory its own pool_name",
            ))  # fmt: skip
        elif info.tier == "l1":
            checks.append(Check.warn(
                f"{setting}: {path} ({human_bytes(info.size)}) was left by a stopped engine: "
                "it holds RAM until a server starts here",
                f"`kvpool clear {directory}` removes it now",
            ))  # fmt: skip
        else:
            checks.append(Check.ok(
                f"{setting}: {path} has no running owner: the next server of that pool "
                f"reuses its {info.blocks} blocks"
            ))  # fmt: skip
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    """The `doctor` command; the exit status is 1 if a server would fail to start."""
    parser = doctor_parser(
        "python -m vllm_marconi_offload doctor",
        "Check this host before a vllm-marconi-offload server starts.",
        f"a YAML file of connector settings, as config_file / {CONFIG_FILE_ENV} name it",
    )
    args = parser.parse_args(argv)
    extra = extra_config(parser, args)
    if args.config is not None:
        os.environ[CONFIG_FILE_ENV] = args.config  # read as a server reads it
    logging.getLogger("vllm").addHandler(logging.NullHandler())  # the checklist says it all
    checks = doctor_checks(extra, args.prefix_caching_hash_algo)
    return report(f"{PLUGIN} doctor", checks)


if __name__ == "__main__":
    sys.exit(main())
