"""memkv-vllm's startup check: `register` warns on a vLLM outside `SUPPORTED_VLLM` only.
(The range itself agreeing with the connector's, the `vllm` extra, the README and the nox
matrix: vllm-marconi-offload's tests/test_supported_vllm.py.)"""

from __future__ import annotations

import logging

import memkv_vllm
import pytest


@pytest.mark.vllm
@pytest.mark.parametrize("release", ["0.25.0", "0.34.0"])
def test_register_warns_outside_the_supported_range(
    release: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(memkv_vllm, "_registered", False)
    monkeypatch.setattr(vllm, "__version__", release)
    with caplog.at_level(logging.WARNING, logger="vllm.memkv_vllm"):
        memkv_vllm.register()
    expected = f"memkv-vllm supports vLLM {memkv_vllm.SUPPORTED_VLLM}; running {release}"
    assert expected in caplog.messages


@pytest.mark.vllm
def test_register_is_quiet_on_the_running_vllm(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(memkv_vllm, "_registered", False)
    with caplog.at_level(logging.WARNING, logger="vllm.memkv_vllm"):
        memkv_vllm.register()
    assert not [m for m in caplog.messages if "supports vLLM" in m]
