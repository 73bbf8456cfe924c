"""The server's auth key: ``MEMKV_AUTH_KEY``, else the development key on loopback.

The server reads its key itself (not through the client's ``load_config``), so a
client configuration file never changes what a server accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..auth import dev_key, parse_key
from ..sockio import is_loopback

__all__ = ["server_key"]


def server_key(host: str, env: Mapping[str, str] | None = None) -> bytes:
    """The key to sign with when listening on ``host``; raises ValueError naming the
    variable when it is malformed or required but unset."""
    env = os.environ if env is None else env
    text = env.get("MEMKV_AUTH_KEY")
    if text:
        try:
            return parse_key(text)
        except ValueError as exc:
            raise ValueError(f"MEMKV_AUTH_KEY: {exc}") from None
    if not is_loopback(host):
        raise ValueError("MEMKV_AUTH_KEY is required to listen on a non-loopback address")
    return dev_key()
