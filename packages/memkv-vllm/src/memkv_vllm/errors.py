"""`ConfigError`: the one error every memkv-vllm setting raises when it is invalid."""

from __future__ import annotations

import kv_offload_settings

__all__ = ["ConfigError"]


class ConfigError(kv_offload_settings.ConfigError):
    """A memkv-vllm setting is invalid; the message names where it was set, the key and
    what is accepted, in one line."""

    def __init__(self, where: str, key: str, message: str) -> None:
        super().__init__(f"memkv-vllm: {where} key {key!r}: {message}")
        self.key = key
