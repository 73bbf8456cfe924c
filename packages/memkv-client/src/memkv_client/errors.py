"""Exception hierarchy: one root, tagged by who is to blame and whether a retry helps.

Wire status codes map to exception classes in one table, `STATUS_EXCEPTIONS`,
read by `error_from_status`.
"""

from __future__ import annotations

import enum

import kv_offload_settings

from .protocol import Status

__all__ = [
    "STATUS_EXCEPTIONS",
    "AuthError",
    "BadMacError",
    "ClockDriftError",
    "ConfigError",
    "ErrorKind",
    "KeyTooLongError",
    "LocalProtocolError",
    "MemKVError",
    "MemKVTimeout",
    "MemberDownError",
    "NoSpaceError",
    "ProtocolError",
    "RdmaUnavailableError",
    "RemoteProtocolError",
    "ReplayError",
    "ServerError",
    "TransportError",
    "UnsupportedVersionError",
    "ValueTooLargeError",
    "error_from_status",
]


class ErrorKind(enum.Enum):
    """Who is to blame for an error."""

    CONFIG = "config"  #: the configuration is wrong
    LOCAL = "local"  #: the caller misused the API (bad key, buffer too small, ...)
    REMOTE = "remote"  #: the peer sent something that breaks the protocol
    NETWORK = "network"  #: connection refused/reset/timed out; a retry may help
    SERVER = "server"  #: the server answered with an error status
    AUTH = "auth"  #: the request or the reply failed authentication


class MemKVError(Exception):
    """Root of every error this package raises."""

    kind: ErrorKind = ErrorKind.SERVER
    #: whether repeating the same call later may succeed
    retryable: bool = False


class ConfigError(MemKVError, kv_offload_settings.ConfigError):
    """A configuration value is invalid; the message names the setting (and the file,
    for a value from `MEMKV_CONFIG`)."""

    kind = ErrorKind.CONFIG

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


class ProtocolError(MemKVError):
    """Base of protocol violations (use the Local/Remote subclasses)."""


class LocalProtocolError(ProtocolError, ValueError):
    """The caller asked for something the protocol cannot express."""

    kind = ErrorKind.LOCAL


class KeyTooLongError(LocalProtocolError):
    """A key is longer than the wire limit (512 bytes)."""


class ValueTooLargeError(LocalProtocolError):
    """A value is longer than the server's advertised per-value limit."""


class RemoteProtocolError(ProtocolError):
    """The peer sent a malformed or unexpected frame."""

    kind = ErrorKind.REMOTE


class TransportError(MemKVError, ConnectionError):
    """The connection failed (refused, reset, closed mid-frame); retryable."""

    kind = ErrorKind.NETWORK
    retryable = True


class MemKVTimeout(TransportError, TimeoutError):  # noqa: N818 (name kept from the vendor API)
    """A connect or a request ran past its deadline."""


class MemberDownError(TransportError):
    """Nothing was sent: the member is marked down (it missed a deadline or refused a
    connection) until a background probe succeeds (`memkv_client.health`)."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(message)
        self.address = address


class RdmaUnavailableError(MemKVError):
    """`transport=rdma` was requested but no usable RDMA device/backend exists."""

    kind = ErrorKind.CONFIG


class ServerError(MemKVError):
    """The server answered with a non-OK status."""

    kind = ErrorKind.SERVER

    def __init__(self, status: Status, message: str = "") -> None:
        text = f"{status.name}: {message}" if message else status.name
        super().__init__(text)
        self.status = status


class NoSpaceError(ServerError):
    """The server could not make room for a value (everything pinned)."""

    retryable = True


class UnsupportedVersionError(ServerError):
    """No protocol version is common to client and server."""


class AuthError(ServerError):
    """Base of authentication failures; never retryable with the same key."""

    kind = ErrorKind.AUTH


class BadMacError(AuthError):
    """The HMAC did not verify: the two sides hold different keys."""


class ClockDriftError(AuthError):
    """The request timestamp is outside the server's replay window."""


class ReplayError(AuthError):
    """The server has already seen this exact signed request."""


STATUS_EXCEPTIONS: dict[Status, type[ServerError]] = {
    Status.NO_SPACE: NoSpaceError,
    Status.UNSUPPORTED_VERSION: UnsupportedVersionError,
    Status.BAD_MAC: BadMacError,
    Status.CLOCK_DRIFT: ClockDriftError,
    Status.REPLAY: ReplayError,
}


def error_from_status(status: Status, message: str = "") -> ServerError:
    """Build the exception for a non-OK wire status."""
    return STATUS_EXCEPTIONS.get(status, ServerError)(status, message)
