"""The environment variables memkv-client reads that are no client setting (each setting's
own `MEMKV_*` variable is declared with it, in `config.SETTINGS`), declared once: their
names for the code that reads them, their docs for the README table."""

from __future__ import annotations

from kv_offload_settings import Setting

__all__ = ["CONFIG_ENV", "ENVIRONMENT", "KEY_FILE_ENV"]

CONFIG_ENV = "MEMKV_CONFIG"
KEY_FILE_ENV = "MEMKV_AUTH_KEY_FILE"
ENVIRONMENT: dict[str, Setting] = {
    CONFIG_ENV: Setting(
        "text",
        "A YAML mapping of the settings above (and of a plugin's keys, such as memkv-vllm's); "
        "a key in it wins over its variable. Every error about a value from it names the file.",
        None,
        accepts="a path to a YAML file",
        name=CONFIG_ENV,
    ),
    KEY_FILE_ENV: Setting(
        "text",
        "Without `auth_key`, loopback-only clients and servers of one user share this key "
        "file (created random with mode 0600; one others can read is refused); "
        "`$XDG_CONFIG_HOME/memkv/auth.key` where `XDG_CONFIG_HOME` is set.",
        "~/.config/memkv/auth.key",
        accepts="a file path",
        name=KEY_FILE_ENV,
    ),
}
"""Variable name -> declaration."""
