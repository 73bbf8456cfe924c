"""The README's configuration tables are the ones generated from the declarations (the
store's table: names exactly the declared keys, with their defaults)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from memkv_vllm.store.settings import StoreConfig

ROOT = Path(__file__).resolve().parents[3]
README = Path(__file__).resolve().parents[1] / "README.md"
PROSE_DEFAULTS = {"— (required)": "", "host name": ""}
"""Default cells written in words, and the declared default each stands for."""


def readme_table(first_header: str) -> dict[str, str]:
    """Key -> default cell of the README table whose header row starts with `first_header`;
    a row `a` / `b` with defaults `x` / `y` gives both keys."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    column = header.index("default")
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        keys = re.findall(r"`([^`]+)`", cells[0])
        defaults = cells[column].split(" / ") if len(keys) > 1 else [cells[column]]
        assert len(defaults) == len(keys), line
        rows.update(zip(keys, defaults, strict=True))
    return rows


def declared(cls: Any) -> dict[str, Any]:
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.name != "sources"
    }


def same_default(cell: str, value: Any) -> bool:
    text = PROSE_DEFAULTS.get(cell, cell.strip("`"))
    if isinstance(value, bool):
        return text == str(value).lower()
    if isinstance(value, int | float):
        return float(text) == value
    return text in (value, f'"{value}"')


@pytest.mark.parametrize("name", ["memkv-vllm-tier", "memkv-vllm-direct"])
def test_generated_tables_match_the_declarations(name: str) -> None:
    spec = importlib.util.spec_from_file_location(
        "settings_tables", ROOT / "tools/settings_tables.py"
    )
    assert spec is not None
    assert spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = README.read_text()
    assert tables.render(name, text) == text, (
        f"{README}: the {name} table differs from the declarations; "
        "run python tools/settings_tables.py"
    )


@pytest.mark.parametrize(("first_header", "cls"), [("key | env", StoreConfig)])
def test_readme_table_matches_the_declarations(first_header: str, cls: Any) -> None:
    table, keys = readme_table(first_header), declared(cls)
    assert sorted(table) == sorted(keys), f"{README}: the {cls.__name__} table"
    wrong = {k: (table[k], v) for k, v in keys.items() if not same_default(table[k], v)}
    assert not wrong, f"{README}: defaults differ from {cls.__name__}'s: {wrong}"
