"""The RDMA NIC one rank drives: the one on its own GPU's PCIe switch, read from sysfs.

Both store backends call `rank_nic` once per rank at startup and log its choice; the
choice itself is `memkv_client.topology.choose_nic` (`memkv net topo` prints it for
every GPU). No vLLM import.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from memkv_client.topology import choose_nic

__all__ = ["rank_nic"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


def rank_nic(
    gpu: int | None,
    candidates: Sequence[str] | None = None,
    source: str = "",
    sysfs: str | Path = "/sys",
) -> str | None:
    """The NIC the rank on CUDA device `gpu` drives RDMA through; None if none is a candidate.

    The candidates are `candidates` when given (a backend's explicit device setting,
    named by `source` in the log; empty: all), else the NICs `MEMKV_RDMA_DEVICES` names,
    else every NIC with an active port. The closest one to the GPU wins (`PIX`: on its
    PCIe switch); without a GPU (`gpu` None), the first candidate. Logs one line.
    """
    env: Mapping[str, str] = os.environ
    if candidates is not None:
        env = {**env, "MEMKV_RDMA_DEVICES": ",".join(candidates)}
    choice = choose_nic(gpu, sysfs, env)
    given = f" (candidates set by {source})" if candidates is not None and source else ""
    log.info("memkv-vllm: RDMA device for GPU %s: %s%s", gpu, choice.describe(), given)
    return choice.nic
