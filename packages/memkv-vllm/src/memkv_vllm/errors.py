"""`ConfigError`: the one error every memkv-vllm setting raises when it is invalid."""

from __future__ import annotations

import kv_offload_settings

__all__ = ["ConfigError"]


class ConfigError(kv_offload_settings.ConfigError):
    """A memkv-vllm setting is invalid; one line, `memkv-vllm: <where>: <problem>`: where
    it was set (a vLLM config entry, `MEMKV_CONFIG <file>` or the environment), then the
    key, the value and what is accepted.

    With `key`, `problem` is what follows the key (`ConfigError(where, "n", "got 0;
    accepted: >= 1")`); with `key=""` it is the whole problem, key included (the form
    `kv_offload_settings` checks give).
    """

    def __init__(self, where: str, key: str, problem: str) -> None:
        text = f"{where} key {key!r}: {problem}" if key else f"{where}: {problem}"
        super().__init__(f"memkv-vllm: {text}")
        self.key = key
