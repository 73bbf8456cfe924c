"""Where settings come from besides code: a YAML config file, and the check that every
key a source gives is a setting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ._errors import ConfigError, unknown_keys_message

__all__ = ["check_keys", "read_config_file"]


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file `path` (empty for an empty file); ConfigError naming
    the file if it cannot be read, is not YAML or holds no mapping."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML: {problem}{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: must hold a mapping of settings (key: value), got {type(data).__name__}"
        )
    return {str(k): v for k, v in data.items()}


def check_keys(values: Mapping[str, Any], accepted: Iterable[str], where: str) -> None:
    """ConfigError naming `where` (a file or a config entry), the keys of `values` that
    are not `accepted`, the nearest accepted key of each and every accepted key."""
    known = set(accepted)
    unknown = [key for key in values if key not in known]
    if unknown:
        raise ConfigError(f"{where}: {unknown_keys_message(unknown, known)}")
