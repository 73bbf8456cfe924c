"""The README's configuration table is the one generated from the connector's setting declarations."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_readme_table_matches_the_declarations() -> None:
    spec = importlib.util.spec_from_file_location(
        "settings_tables", ROOT / "tools/settings_tables.py"
    )
    assert spec is not None
    assert spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    readme = ROOT / "packages/vllm-marconi-offload/README.md"
    text = readme.read_text()
    assert tables.render("vllm-marconi-offload", text) == text, (
        f"{readme}: the settings table differs from the declarations; "
        "run python tools/settings_tables.py"
    )
