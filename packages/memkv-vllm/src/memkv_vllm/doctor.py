"""`python -m memkv_vllm doctor`: check this host before a vLLM server with memkv-vllm starts.

From the configuration a server would take (`kv_connector_extra_config`, `MEMKV_CONFIG`,
`MEMKV_*`): vLLM's version, `PYTHONHASHSEED`, the locked-memory limit, and every store
member, probed by its backend (`doctor_checks`, see `.store.registry`): e.g. each `memkv
serve` answers a request signed with the configured auth key, or Mooncake Store's master
and metadata server answer. Each probe has a short deadline. vLLM is not imported.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import memkv_client
from vllm_kv_identity.doctor import Check, doctor_parser, extra_config, report
from vllm_kv_identity.host_checks import (
    hash_seed_check,
    installed_vllm,
    memlock_check,
    vllm_version_check,
)

from ._version import SUPPORTED_VLLM
from .config import DirectConfig
from .early_check import configured_stores
from .errors import ConfigError
from .store import StoreConfig, backend_class

__all__ = ["doctor_checks", "main"]

PLUGIN = "memkv-vllm"
_MODES = {
    "direct": "direct mode",
    "tier": "secondary tier",
    "store": "no vLLM config given: the store MEMKV_CONFIG / MEMKV_* describe",
}
LOST = "instances never share KV through the store (a restarted one does not find its own)"


def doctor_checks(
    extra: Mapping[str, Any] | None, hash_algorithm: str | None = None, timeout: float = 2.0
) -> list[Check]:
    """Every check, in order, for a server given `extra` as `kv_connector_extra_config`
    in this environment; None: no vLLM config given, check the store `MEMKV_CONFIG` and
    `MEMKV_*` describe. Each network probe ends within `timeout` seconds."""
    installed = installed_vllm()
    version = installed[1] if installed else None
    checks = [
        vllm_version_check(PLUGIN, SUPPORTED_VLLM, installed),
        hash_seed_check(version, hash_algorithm, os.environ.get("PYTHONHASHSEED"), LOST),
    ]
    try:
        stores = (
            configured_stores(extra)
            if extra is not None
            else [("store", StoreConfig.resolve({}, "MEMKV_CONFIG"))]
        )
    except (ConfigError, memkv_client.ConfigError) as exc:
        checks.append(Check.fail(f"configuration: {exc}", "correct that value"))
        return checks
    if not stores:
        checks.append(Check.fail(
            "configuration: kv_connector_extra_config sets up no memkv-vllm store",
            'use "spec_name": "MemKVOffloadingSpec", "spec_module_path": "memkv_vllm.spec", '
            'or a {"type": "memkv"} entry in "secondary_tiers"',
        ))  # fmt: skip
        return checks
    modes = ", ".join(f"{_MODES[mode]} ({store.backend})" for mode, store in stores)
    checks.append(Check.ok(f"configuration: valid; {modes}"))
    memlock = _memlock(extra or {}, stores)
    checks += [memlock] if memlock is not None else []
    for _, store in stores:
        checks += _member_checks(store, timeout)
    return checks


def _memlock(extra: Mapping[str, Any], stores: list[tuple[str, StoreConfig]]) -> Check | None:
    """The memory a server pins: vLLM's CPU pool in front of a tier (`cpu_bytes_to_use`)
    and the direct mode's scratch areas; it must be lockable over RDMA. None if none."""
    need, what = 0, []
    modes = {mode for mode, _ in stores}
    if "tier" in modes and isinstance(extra.get("cpu_bytes_to_use"), int):
        need += extra["cpu_bytes_to_use"]
        what.append("vLLM's CPU pool (cpu_bytes_to_use)")
    if "direct" in modes:
        direct = DirectConfig.from_extra_config(extra)
        need += (direct.memkv_num_threads * direct.memkv_scratch_mb_per_thread) << 20
        what.append("the direct mode's scratch areas")
    rdma = any(_uses_rdma(store) for _, store in stores)
    if not need:
        return None
    purpose = " and ".join(what) + (" over RDMA" if rdma else "")
    return memlock_check(need, purpose, required=rdma)


def _uses_rdma(store: StoreConfig) -> bool:
    uses_rdma = getattr(backend_class(store.backend), "uses_rdma", None)
    return bool(uses_rdma(store)) if uses_rdma is not None else False


def _member_checks(store: StoreConfig, timeout: float) -> list[Check]:
    """The backend's own probes of its members (`doctor_checks`, see `.store.registry`)."""
    probes = getattr(backend_class(store.backend), "doctor_checks", None)
    if probes is None:
        return [Check.ok(f"store: backend {store.backend} has no doctor probe; not checked")]
    checks: list[Check] = probes(store, timeout)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    """The `doctor` command; the exit status is 1 if a server would fail to start."""
    parser = doctor_parser(
        "python -m memkv_vllm doctor",
        "Check this host before a vLLM server with memkv-vllm starts. Without "
        "--kv-transfer-config: the store MEMKV_CONFIG and MEMKV_* describe.",
        "the YAML file MEMKV_CONFIG names (servers, auth key, store backend)",
    )
    args = parser.parse_args(argv)
    given = args.kv_transfer_config is not None or args.extra_config is not None
    extra = extra_config(parser, args) if given else None
    if args.config is not None:
        os.environ["MEMKV_CONFIG"] = args.config  # read as a server reads it
    logging.getLogger("vllm").addHandler(logging.NullHandler())  # the checklist says it all
    logging.getLogger("memkv_client").addHandler(logging.NullHandler())
    checks = doctor_checks(extra, args.prefix_caching_hash_algo, args.timeout)
    return report(f"{PLUGIN} doctor", checks)


if __name__ == "__main__":
    sys.exit(main())
