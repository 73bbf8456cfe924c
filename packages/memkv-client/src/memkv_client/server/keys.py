"""The server's auth key: `MEMKV_AUTH_KEY`, else (loopback only) the per-user key file.

The server reads its key itself (not through the client's `load_config`), so a
client configuration file never changes what a server accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..auth import parse_key, user_key, user_key_path
from ..sockio import is_loopback

__all__ = ["server_key"]


def server_key(host: str, env: Mapping[str, str] | None = None) -> tuple[bytes, str]:
    """The key to sign with when listening on `host` and where it came from; raises
    ValueError naming the variable or file when it is malformed, or required but unset."""
    env = os.environ if env is None else env
    text = env.get("MEMKV_AUTH_KEY")
    if text:
        try:
            return parse_key(text), "MEMKV_AUTH_KEY"
        except ValueError as exc:
            raise ValueError(f"MEMKV_AUTH_KEY: {exc}") from None
    if not is_loopback(host):
        raise ValueError("MEMKV_AUTH_KEY is required to listen on a non-loopback address")
    path = user_key_path(env)
    return user_key(path), str(path)
