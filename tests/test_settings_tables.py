"""Every README settings table is the one generated from its package's declarations
(`python tools/settings_tables.py` rewrites them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from settings_tables import TABLES, render


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_readme_table_matches_the_declarations(name: str) -> None:
    readme, _ = TABLES[name]
    package = readme.parent.name.replace("-", "_")  # packages/<distribution>/README.md
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed in this session")
    text = readme.read_text()
    assert render(name, text) == text, f"{readme}: run python tools/settings_tables.py"
