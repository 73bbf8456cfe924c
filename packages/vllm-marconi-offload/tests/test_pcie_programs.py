"""`VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM` sizes the kernels that cross PCIe; a bad
value is refused with the variable's name and the accepted form."""

from __future__ import annotations

import pytest
from vllm_marconi_offload.config import ConfigError


@pytest.mark.vllm  # the worker's modules import torch
def test_programs_per_sm_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_marconi_offload.cuda_mover import HOST_PROGRAMS_PER_SM, host_programs_per_sm_from_env

    monkeypatch.delenv("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", raising=False)
    assert host_programs_per_sm_from_env() == HOST_PROGRAMS_PER_SM
    monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", "4")
    assert host_programs_per_sm_from_env() == 4
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv("VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM", bad)
        with pytest.raises(ConfigError, match=r"PCIE_PROGRAMS_PER_SM='.*': expected a positive"):
            host_programs_per_sm_from_env()
