"""Every name a package exports in `__all__` exists (`from package import *` works)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from import_graph import package_sources


@pytest.mark.parametrize("name", sorted(package_sources()))
def test_every_exported_name_exists(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed in this session")
    module = importlib.import_module(name)
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what the package does not define: {missing}"
