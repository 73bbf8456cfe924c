"""Settings declared once: kind, default, bounds and a one-line doc.

A configuration dataclass declares each field with `setting(...)`; `settings_of(cls)`
reads the declarations back (named after their fields). Validation, normalised values,
error messages and README tables (`markdown_table`) all come from them, so a setting is
written in one place. Another package exposes a setting under its own key with `expose`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import ConfigError, did_you_mean
from ._sizes import SIZE_EXAMPLES, parse_size

__all__ = [
    "Kind",
    "Setting",
    "checked_fields",
    "expose",
    "markdown_table",
    "setting",
    "settings_of",
]

Kind = Literal["int", "number", "bool", "choice", "bytes", "path", "name", "text", "any"]
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SETTING = "kv_offload_settings.setting"


@dataclass(frozen=True)
class Setting:
    """One setting: how it is checked and documented.

    `store_name` is the setting of another package it sets when it is exposed under
    another key (`expose`); `env` is the environment variable that sets it, if any.
    """

    kind: Kind
    doc: str
    default: Any = dataclasses.MISSING
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    accepts: str = ""
    """The accepted form in words (kinds `text` and `any`)."""
    optional: bool = False
    """None is accepted (and means: not set)."""
    name: str = ""
    store_name: str = ""
    env: str = ""
    secret: bool = False
    """Never shown: not in the dataclass's repr, nor in an error (a key, a password)."""

    def accepted(self) -> str:
        """The accepted form in words, e.g. `an integer in [1, 256]`."""
        if self.kind == "int":
            return f"an integer {self._bounds()}"
        if self.kind == "number":
            return f"a finite number {self._bounds()}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return f"one of {list(self.choices)}"
        if self.kind == "bytes":
            return f"a byte count {self._bounds()} such as {SIZE_EXAMPLES}"
        if self.kind == "path":
            return "an absolute directory path"
        if self.kind == "name":
            return "1-64 characters of A-Z a-z 0-9 _ . -"
        return self.accepts

    def default_text(self) -> str:
        """The default as a user writes it ("required" if there is none)."""
        if self.default is dataclasses.MISSING:
            return "required"
        if self.default is None:
            return "not set"
        if self.kind == "bytes" and self.default and self.default % (1 << 30) == 0:
            return f"{self.default >> 30}GiB"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, int | float):
            return _number_text(self.default, self.kind)
        if isinstance(self.default, str):
            return self.default or '""'
        if isinstance(self.default, enum.Enum):
            return str(self.default.value)
        if isinstance(self.default, tuple):
            return ",".join(str(v) for v in self.default if v is not None) or "not set"
        return repr(self.default)

    def check(self, value: Any, key: str = "", error: type[ConfigError] = ConfigError) -> Any:
        """`value` normalised (e.g. `"8GiB"` -> 8589934592), or `error` (a ConfigError)
        naming `key` (default: the setting's name), the value and the accepted form."""
        key = key or self.name
        if value is None and self.optional:
            return None
        checker = _CHECKS.get(self.kind)
        normal = value if checker is None else checker(self, value)
        if normal is _BAD:
            raise error(f"{key} must be {self.accepted()}{self.got(value)}{self._why(value)}")
        return normal

    def got(self, value: Any) -> str:
        """`, got <value>` for an error message ("" for a secret setting)."""
        return "" if self.secret else f", got {value!r}"

    def field(self) -> Any:
        """A dataclass field carrying this declaration."""
        metadata = {_SETTING: self}
        if isinstance(self.default, Mapping):
            default = dict(self.default)
            return dataclasses.field(
                default_factory=lambda: dict(default), metadata=metadata, repr=not self.secret
            )
        return dataclasses.field(default=self.default, metadata=metadata, repr=not self.secret)

    def _why(self, value: Any) -> str:
        if self.kind == "choice" and isinstance(value, str):
            return did_you_mean(value, self.choices)
        if self.kind == "path" and isinstance(value, str) and value.strip():
            # every process of an engine (scheduler, workers) must name the same directory
            return (
                ": a relative path would name a different directory in each process "
                "(working directories differ)"
            )
        return ""

    def _low(self) -> float:
        return 1 if self.minimum is None else self.minimum

    def _bounds(self) -> str:
        low, high = _number_text(self._low(), self.kind), self.maximum
        if high is None:
            return f">= {low}"
        return f"in [{low}, {_number_text(high, self.kind)}]"

    def _in_bounds(self, number: float) -> bool:
        return number >= self._low() and (self.maximum is None or number <= self.maximum)


def _number_text(number: float, kind: Kind) -> str:
    if kind != "number" and number >= 1 << 30 and int(number).bit_count() == 1:
        return f"2^{int(number).bit_length() - 1}"
    if float(number).is_integer() and (kind != "number" or number >= 1e6):
        return str(int(number))  # as a user types it (1500000000, not 1.5e+09)
    return f"{number:g}" if kind != "number" else str(float(number))


def setting(kind: Kind, doc: str, default: Any = dataclasses.MISSING, **bounds: Any) -> Any:
    """Declare a dataclass field as a setting (see `Setting` for the keyword arguments)."""
    return Setting(kind, doc, default, **bounds).field()


def expose(declared: Setting, **changes: Any) -> Any:
    """Declare a dataclass field as `declared` (another package's setting) under the
    field's own name, with `changes` (e.g. another default or doc)."""
    return dataclasses.replace(declared, name="", store_name=declared.name, **changes).field()


def settings_of(cls: type) -> dict[str, Setting]:
    """The settings `cls` declares, by field name, in declaration order."""
    out = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_SETTING)
        if declared is not None:
            out[f.name] = dataclasses.replace(declared, name=declared.name or f.name)
    return out


def checked_fields(
    instance: Any, key: Callable[[str], str], error: type[ConfigError] = ConfigError
) -> None:
    """Check and normalise every declared field of a frozen dataclass instance in place;
    `key(name)` is the name used in errors, `error` the ConfigError class raised."""
    for name, declared in settings_of(type(instance)).items():
        normal = declared.check(getattr(instance, name), key(name), error)
        object.__setattr__(instance, name, normal)


def markdown_table(settings: Mapping[str, Setting], header: str = "Setting") -> str:
    """A README table: key, environment variable (if any setting has one), accepted
    values, default, meaning."""
    env = any(declared.env for declared in settings.values())
    heads = [header, *(["Environment"] if env else []), "Accepted", "Default", "Meaning"]
    rows = ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
    for name, declared in settings.items():
        cells = [f"`{name}`", declared.accepted(), f"`{declared.default_text()}`", declared.doc]
        if env:
            cells.insert(1, f"`{declared.env}`" if declared.env else "")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


_BAD: Any = object()


def _int(s: Setting, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return _BAD
    try:
        number = int(value)
    except (ValueError, OverflowError):  # "x", NaN, inf
        return _BAD
    if isinstance(value, float) and number != value:
        return _BAD
    return number if s._in_bounds(number) else _BAD


def _number(s: Setting, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return _BAD
    try:
        number = float(value)
    except ValueError:
        return _BAD
    return number if math.isfinite(number) and s._in_bounds(number) else _BAD


def _bytes(s: Setting, value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError:
            return _BAD
    return _int(s, value)


def _bool(s: Setting, value: Any) -> Any:
    return value if isinstance(value, bool) else _BAD


def _choice(s: Setting, value: Any) -> Any:
    return value if isinstance(value, str) and value in s.choices else _BAD


def _name(s: Setting, value: Any) -> Any:
    return value if isinstance(value, str) and _NAME.match(value) else _BAD


def _text(s: Setting, value: Any) -> Any:
    return value if isinstance(value, str) else _BAD


def _path(s: Setting, value: Any) -> Any:
    if not isinstance(value, str | os.PathLike):
        return _BAD
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        return _BAD
    return value if os.path.isabs(text) else _BAD


_CHECKS: dict[str, Callable[[Setting, Any], Any]] = {
    "int": _int,
    "number": _number,
    "bool": _bool,
    "choice": _choice,
    "bytes": _bytes,
    "path": _path,
    "name": _name,
    "text": _text,
}
