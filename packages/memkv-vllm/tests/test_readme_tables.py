"""The README's configuration tables are the ones generated from the declarations (the
tier's, the direct mode's, and the store's: the shared keys and each backend's own)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("name", ["memkv-vllm-tier", "memkv-vllm-direct", "memkv-vllm-store"])
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
