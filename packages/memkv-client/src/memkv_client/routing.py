"""Rendezvous (highest-random-weight) hashing of keys onto servers.

Each (server, key) pair gets a 64-bit score; a key lives on the server with the highest
score. Adding a server to N moves only the keys it now wins, about 1/(N+1) of them, and
removing one moves only its own keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["Router", "hrw_score"]


def hrw_score(server: str, key: bytes) -> int:
    """Score of `key` on `server` (stable across processes and versions)."""
    digest = hashlib.blake2b(server.encode() + b"\x00" + key, digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Router:
    """Maps keys to server indices; immutable, so safe to share between threads."""

    def __init__(self, servers: Sequence[str]) -> None:
        if not servers:
            raise ValueError("at least one server is required")
        self.servers = tuple(servers)

    def rank(self, key: bytes) -> list[int]:
        """All server indices for `key`, best first."""
        scores = [(hrw_score(s, key), i) for i, s in enumerate(self.servers)]
        return [i for _, i in sorted(scores, reverse=True)]

    def route(self, key: bytes) -> int:
        """Index of the server that owns `key`."""
        if len(self.servers) == 1:
            return 0
        best, best_i = -1, 0
        for i, s in enumerate(self.servers):
            score = hrw_score(s, key)
            if score > best:
                best, best_i = score, i
        return best_i

    def group(self, keys: Sequence[bytes]) -> dict[int, list[int]]:
        """Positions of `keys` grouped by owning server, input order kept in each group."""
        groups: dict[int, list[int]] = {}
        for pos, key in enumerate(keys):
            groups.setdefault(self.route(key), []).append(pos)
        return groups
