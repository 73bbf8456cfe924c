"""Building the MemKV client and checking, at startup, that every server answers."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["connect", "servers_source", "warn_if_hashes_differ_per_process"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


def connect(probe: bool, who: str) -> Any:
    """A ``memkv_client.Client`` from ``MEMKV_CONFIG`` / ``MEMKV_*``.

    With ``probe``, every configured server is asked directly (``exists_on``); a server
    that does not answer fails startup with a message naming it and the settings used.
    """
    import memkv_client

    client = memkv_client.Client()
    if not probe:
        return client
    servers = client.servers()
    for server in servers:
        try:
            client.exists_on(server, [b"memkv-vllm/probe"])
        except Exception as exc:
            client.close()
            raise RuntimeError(
                f"memkv-vllm ({who}): MemKV server {server} does not answer ({exc}). "
                f"Configured servers: {', '.join(servers)}, {servers_source()}. Start "
                "`memkv serve` there, or point MEMKV_SERVERS at a running server."
            ) from exc
    log.info(
        "memkv-vllm (%s): connected to %d MemKV server(s) %s over %s",
        who, len(servers), ",".join(servers), "RDMA" if client.has_rdma() else "TCP",
    )  # fmt: skip
    return client


def servers_source(env: Mapping[str, str] = os.environ) -> str:
    """Where memkv-client takes the server list from, naming the settings a user edits."""
    config = env.get("MEMKV_CONFIG")
    servers = env.get("MEMKV_SERVERS")
    return (
        f"taken from the servers: field of MEMKV_CONFIG ({config or 'unset'}), "
        f"else MEMKV_SERVERS ({servers or 'unset'}), else the default 127.0.0.1:9900"
    )


def warn_if_hashes_differ_per_process() -> None:
    """One startup warning when this vLLM would hash blocks differently per process."""
    from ._compat import hash_seed_problem

    problem = hash_seed_problem()
    if problem:
        log.warning(
            "memkv-vllm: %s and PYTHONHASHSEED is unset: instances will never share KV "
            "through MemKV (and a restarted instance will not find its own). Set "
            "PYTHONHASHSEED (e.g. 0) to the same value on every instance.",
            problem,
        )
