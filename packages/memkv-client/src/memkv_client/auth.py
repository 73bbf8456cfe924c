"""Frame authentication: HMAC-SHA256 frame MACs, per-connection session keys, BLAKE3
value digests, the clock window, and the per-user key file used when no key is configured.

Every connection opens with HELLO and AUTH. The client's HELLO sends a random nonce; the
server answers with its boot nonce (random per start) and a challenge (random per
connection), signed with a key bound to the client's nonce. The client's AUTH answers
the challenge: it is signed with `session = HMAC(key, "memkv-v3 session" ||
client_nonce || boot_nonce || challenge)`, as is every later frame in both directions.
Only a verified AUTH authenticates a connection, so recorded opening bytes, replayed to
any server at any time, never do. See `docs/memkv-protocol.md` ("Threat model").
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import blake3

from .environment import KEY_FILE_ENV
from .protocol import MAC_SIZE, Status

__all__ = [
    "KEY_SIZE",
    "ClockWindow",
    "Signer",
    "check_key",
    "parse_key",
    "user_key",
    "user_key_path",
    "value_digest",
]

KEY_SIZE = 32
DEFAULT_CLOCK_WINDOW_NS = 30 * 1_000_000_000

log = logging.getLogger("memkv_client.auth")


def check_key(key: bytes) -> bytes:
    """`key` if it is usable: exactly 32 bytes and not all zero; else ValueError."""
    if len(key) != KEY_SIZE:
        raise ValueError(f"must be {KEY_SIZE} bytes ({2 * KEY_SIZE} hex digits), got {len(key)}")
    if not any(key):
        raise ValueError("an all-zero key is refused: generate one with `openssl rand -hex 32`")
    return key


def parse_key(text: str) -> bytes:
    """Decode a 64-hex-digit key; raises ValueError with the reason."""
    text = text.strip()
    if len(text) != 2 * KEY_SIZE:
        raise ValueError(f"must be {2 * KEY_SIZE} hex digits (got {len(text)} characters)")
    try:
        return check_key(bytes.fromhex(text))
    except ValueError as exc:
        if "key" in str(exc):
            raise
        raise ValueError("must be hex digits only") from None


def user_key_path(env: Mapping[str, str] | None = None) -> Path:
    """`MEMKV_AUTH_KEY_FILE`, else `$XDG_CONFIG_HOME/memkv/auth.key` (`~/.config`)."""
    env = os.environ if env is None else env
    if env.get(KEY_FILE_ENV):
        return Path(env[KEY_FILE_ENV])
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "memkv" / "auth.key"


def user_key(path: Path) -> bytes:
    """The key in `path`, created (random, mode 0600) if it does not exist yet.

    Used when no key is configured and every address is loopback: a client and a server
    run by the same user agree, and other users cannot read it. Creation is atomic (a
    hard link of a finished temporary file), so concurrent first users agree; the one
    that creates it logs one warning line saying where it is and how to share it. Raises
    ValueError if the file is readable by others, not owned by this user, or malformed.
    """
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_hex(KEY_SIZE) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process won the race (and says so)
            pass
        else:
            log.warning(
                "memkv: created the auth key %s (random, mode 0600), shared by this user's "
                "clients and servers on this host; for other hosts set MEMKV_AUTH_KEY=$(cat "
                "%s) for every client and server (required off loopback)",
                path,
                path,
            )
        finally:
            tmp.unlink()
    st = path.stat()
    if st.st_uid != os.getuid():
        raise ValueError(f"{path}: owned by uid {st.st_uid}, not by this user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(f"{path}: mode {stat.S_IMODE(st.st_mode):o} lets others read it; use 0600")
    try:
        return parse_key(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def value_digest(views: Sequence[memoryview | bytes]) -> bytes:
    """BLAKE3 (32 bytes) of a value held in one or more buffers; the GIL is released while
    hashing. BLAKE3 rather than SHA-256: it is as collision-resistant and hashes KV values
    several times faster, so the digest costs little next to the copy."""
    h = blake3.blake3()
    for v in views:
        h.update(v)
    return h.digest()


class Signer:
    """Computes and checks frame MACs under one key."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        try:
            self._key = check_key(key)
        except ValueError as exc:
            raise ValueError(f"auth key: {exc}") from None

    def derive(self, label: bytes, *parts: bytes) -> Signer:
        """A signer whose key is `HMAC(key, label || parts...)` (HELLO replies, sessions)."""
        h = hmac.new(self._key, label, hashlib.sha256)
        for part in parts:
            h.update(part)
        return Signer(h.digest())

    def session(self, client_nonce: bytes, boot_nonce: bytes, challenge: bytes) -> Signer:
        """The signer of AUTH and of every later frame on one connection: bound to the
        server's fresh challenge, so nothing recorded elsewhere verifies."""
        return self.derive(b"memkv-v3 session", client_nonce, boot_nonce, challenge)

    def hello_reply(self, client_nonce: bytes) -> Signer:
        """The signer of HELLO replies: bound to the client's nonce, so they are fresh."""
        return self.derive(b"memkv-v3 hello", client_nonce)

    def start(self, header: bytes) -> hmac.HMAC:
        """An HMAC fed with `header`; feed the metadata as it arrives, then `check`."""
        return hmac.new(self._key, header, hashlib.sha256)

    @staticmethod
    def check(h: hmac.HMAC, mac: bytes) -> bool:
        return len(mac) == MAC_SIZE and hmac.compare_digest(h.digest(), mac)

    def sign(self, header: bytes, meta: bytes | bytearray | memoryview) -> bytes:
        h = self.start(header)
        h.update(meta)
        return h.digest()

    def verify(self, header: bytes, meta: bytes | bytearray | memoryview, mac: bytes) -> bool:
        return len(mac) == MAC_SIZE and hmac.compare_digest(self.sign(header, meta), mac)


class ClockWindow:
    """Rejects requests whose timestamp is more than `window_ns` from the server clock.

    Stateless: replays are stopped by per-connection session keys and request ids that
    must increase by one, so no memory of past requests is kept.
    """

    def __init__(
        self, window_ns: int = DEFAULT_CLOCK_WINDOW_NS, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.window_ns = window_ns
        self._clock = clock

    def check(self, timestamp_ns: int) -> Status:
        """OK, or CLOCK_DRIFT."""
        if abs(self._clock() - timestamp_ns) > self.window_ns:
            return Status.CLOCK_DRIFT
        return Status.OK
