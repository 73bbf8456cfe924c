"""Every name a package exports in `__all__` exists (`from package import *` works)."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

PACKAGES = [
    "kv_eviction",
    "kvpool_mmap",
    "vllm_kv_astpatch",
    "memkv_client",
    "vllm_marconi_offload",
    "memkv_vllm",
    "vllm_kv_identity",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_exists(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed in this session")
    module = importlib.import_module(name)
    missing = [n for n in getattr(module, "__all__", ()) if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what the package does not define: {missing}"
