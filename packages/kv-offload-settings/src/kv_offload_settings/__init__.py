"""Settings declared once, one configuration error, one size rule: the kit every package
of the KV-offload project configures itself with.

* `setting`, `expose`, `settings_of`, `checked_fields`, `Setting`: a dataclass field
  declares its kind, default, bounds and doc once; checks, normalised values, error
  messages and README tables (`markdown_table`) come from the declaration.
* `ConfigError`: every package's configuration errors are or derive from it, and say in
  one line where (file, key), the problem and the accepted values; `did_you_mean` and
  `unknown_keys_message` name the nearest accepted key of a misspelt one.
* `read_config_file`, `check_keys`: a YAML config file, every error naming the file.
* `parse_size`: `8GiB` = `8GB` = `8G` = `8gib` = `8GIB` = 8589934592 (binary units).

Standard library, bitmath and PyYAML only.
"""

from __future__ import annotations

from ._errors import ConfigError, did_you_mean, unknown_keys_message
from ._settings import Kind, Setting, checked_fields, expose, markdown_table, setting, settings_of
from ._sizes import SIZE_EXAMPLES, parse_size
from ._sources import check_keys, read_config_file
from ._version import __version__

__all__ = [
    "SIZE_EXAMPLES",
    "ConfigError",
    "Kind",
    "Setting",
    "__version__",
    "check_keys",
    "checked_fields",
    "did_you_mean",
    "expose",
    "markdown_table",
    "parse_size",
    "read_config_file",
    "setting",
    "settings_of",
    "unknown_keys_message",
]
