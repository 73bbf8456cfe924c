"""`python -m memkv_vllm doctor`: check this host before a vLLM server with memkv-vllm starts.

From the configuration a server would take (`kv_connector_extra_config`, `MEMKV_CONFIG`,
`MEMKV_*`): vLLM's version, `PYTHONHASHSEED`, the locked-memory limit, and every store
member: each `memkv serve` answers a request signed with the configured auth key (a
wrong key is refused), or Mooncake Store's master RPC port accepts a connection and its
metadata server answers. Each probe has a short deadline. vLLM is not imported.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import urllib.error
import urllib.request
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
from .store import StoreConfig
from .store.memkv import servers_source

__all__ = ["doctor_checks", "main"]

PLUGIN = "memkv-vllm"
PROBE_KEY = b"memkv-vllm/doctor"
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
    if store.backend == "mooncake":
        return store.mooncake_protocol == "rdma"
    if store.backend != "memkv" or store.sources is None:
        return False
    return store.sources.client_config().transport is memkv_client.Transport.RDMA


def _member_checks(store: StoreConfig, timeout: float) -> list[Check]:
    if store.backend == "memkv":
        return _memkv_checks(store, timeout)
    if store.backend == "mooncake":
        return [
            _reachable(
                "Mooncake master",
                store.mooncake_master,
                timeout,
                "start mooncake_master there (--rpc_port)",
            ),
            _metadata_check(store.mooncake_metadata_server, timeout),
        ]
    return [Check.ok(f"store: backend {store.backend} has no doctor probe; not checked")]


def _memkv_checks(store: StoreConfig, timeout: float) -> list[Check]:
    """Each MemKV server answers an `exists` request signed with our key (over TCP: the
    handshake every transport starts with)."""
    try:
        sources = store.sources or memkv_client.ConfigSources.read()
        config = dataclasses.replace(sources.client_config(), transport=memkv_client.Transport.TCP)
        client = memkv_client.Client(config=config)
    except memkv_client.MemKVError as exc:
        return [Check.fail(f"MemKV client settings: {exc}", "correct that setting")]
    checks = []
    with client:
        for server in client.servers():
            try:
                client.exists_on(server, [PROBE_KEY], timeout=timeout)
            except memkv_client.AuthError as exc:
                checks.append(Check.fail(
                    f"MemKV server {server} refuses our auth key ({exc})",
                    "set the same MEMKV_AUTH_KEY for the server and every vLLM instance (on one "
                    "host: run both as the same user, sharing ~/.config/memkv/auth.key)",
                ))  # fmt: skip
            except memkv_client.MemKVError as exc:
                checks.append(Check.fail(
                    f"MemKV server {server} does not answer within {timeout:g} s ({exc})",
                    f"start `memkv serve --listen {server}` there, or correct the servers "
                    f"({servers_source()})",
                ))  # fmt: skip
            else:
                checks.append(Check.ok(f"MemKV server {server} answers and accepts our auth key"))
    return checks


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
