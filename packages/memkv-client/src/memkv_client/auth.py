"""Request signing: HMAC-SHA256 with a shared 32-byte key, plus a replay guard.

The MAC covers the 32-byte header (which carries the timestamp and request id) and the
metadata; bulk value bytes are not covered (see the protocol document for why).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from .protocol import MAC_SIZE, Status

KEY_SIZE = 32
DEFAULT_REPLAY_WINDOW_NS = 30 * 1_000_000_000


def parse_key(text: str) -> bytes:
    """Decode a 64-hex-digit key; raises ValueError with the reason."""
    text = text.strip()
    if len(text) != 2 * KEY_SIZE:
        raise ValueError(f"must be {2 * KEY_SIZE} hex digits (got {len(text)} characters)")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError("must be hex digits only") from None


def dev_key(home: str | None = None) -> bytes:
    """The deterministic development key used when no key is configured (loopback only).

    Derived from ``$HOME`` so a client and a server run by the same user agree.
    """
    home = home if home is not None else os.environ.get("HOME", "/")
    return hashlib.sha256(b"memkv-dev-key\x00" + home.encode()).digest()


class Signer:
    """Computes and checks frame MACs."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"auth key must be {KEY_SIZE} bytes")
        self._key = key

    def sign(self, header: bytes, meta: bytes | bytearray | memoryview) -> bytes:
        h = hmac.new(self._key, header, hashlib.sha256)
        h.update(meta)
        return h.digest()

    def verify(self, header: bytes, meta: bytes | bytearray | memoryview, mac: bytes) -> bool:
        return len(mac) == MAC_SIZE and hmac.compare_digest(self.sign(header, meta), mac)


class ReplayGuard:
    """Rejects requests outside ``±window`` of the server clock and exact replays.

    A MAC seen before is a replay. A request is accepted only while its timestamp is
    within ``window`` of the server's clock, so a copy can arrive at most ``2 x window``
    after the original: each seen MAC is remembered for that long, in arrival order,
    and expired in amortised O(1). At most ``max_entries`` are kept; when full (a flood
    within one window) new requests are refused rather than letting memory grow.
    Thread-safe.
    """

    def __init__(
        self,
        window_ns: int = DEFAULT_REPLAY_WINDOW_NS,
        clock: Callable[[], int] = time.time_ns,
        max_entries: int = 1_000_000,
    ) -> None:
        self.window_ns = window_ns
        self._clock = clock
        self._max = max_entries
        self._seen: set[bytes] = set()
        self._order: deque[tuple[int, bytes]] = deque()
        self._lock = threading.Lock()

    def check(self, timestamp_ns: int, mac: bytes) -> Status:
        """Return OK, CLOCK_DRIFT or REPLAY, and remember the MAC when OK."""
        now = self._clock()
        if abs(now - timestamp_ns) > self.window_ns:
            return Status.CLOCK_DRIFT
        tag = mac[:16]
        with self._lock:
            cutoff = now - 2 * self.window_ns
            while self._order and self._order[0][0] < cutoff:
                self._seen.discard(self._order.popleft()[1])
            if tag in self._seen or len(self._seen) >= self._max:
                return Status.REPLAY
            self._seen.add(tag)
            self._order.append((now, tag))
        return Status.OK

    def __len__(self) -> int:
        return len(self._seen)
