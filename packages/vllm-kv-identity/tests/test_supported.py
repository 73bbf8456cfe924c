from __future__ import annotations

import pytest
from vllm_kv_identity import unsupported_vllm

RANGE = ">=0.26.0,<0.34"


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0+cpu", "0.33.0rc1", "0.33.2"])
def test_releases_inside_the_range_pass(version: str) -> None:
    assert unsupported_vllm("plugin", RANGE, version) is None


@pytest.mark.parametrize("version", ["0.25.9", "0.34.0", "0.34.0rc1", "1.0", "unknown"])
def test_others_get_one_line_naming_plugin_range_and_version(version: str) -> None:
    assert unsupported_vllm("plugin", RANGE, version) == (
        f"plugin supports vLLM {RANGE}; running {version}"
    )
