"""Exceptions: one root, split by cause."""

from __future__ import annotations

import kv_offload_settings


class KvPoolError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(KvPoolError, kv_offload_settings.ConfigError):
    """A setting is invalid; the message names the setting and the accepted values."""


class InsufficientSpaceError(KvPoolError, OSError):
    """The filesystem cannot hold the reserved pool (raised at startup, never as SIGBUS later)."""


class LayoutMismatchError(KvPoolError, ValueError):
    """An existing file was written under another geometry, engine or fingerprint."""


class PoolInUseError(KvPoolError, OSError):
    """Another process holds this engine's L2 files (same engine_id on the same directory)."""
