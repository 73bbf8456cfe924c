"""Serving imports only what it runs: the runtime package (what kvpool-mmap and the
connector import, every built-in policy built and used) loads none of the simulator and
benchmark harness (`kv_eviction.sim`) nor its progress-bar dependency."""

from __future__ import annotations

import json
import subprocess
import sys

SERVE = """
import json, sys
import kv_eviction, kv_eviction.retention
from kv_eviction import AdmissionTracker, make_policy, policy_names, validate_policy
for name in policy_names():
    validate_policy(name, {})
    policy = make_policy(name)
    policy.insert("a")
    policy.touch("a")
    policy.pop_victims(1)
AdmissionTracker(threshold=2, max_entries=8).observe("a")
print(json.dumps(sorted(m for m in sys.modules if m.startswith("kv_eviction") or m == "tqdm")))
"""
RUNTIME = [
    "kv_eviction",
    "kv_eviction._ghost",
    "kv_eviction._shadow",
    "kv_eviction._version",
    "kv_eviction.admission",
    "kv_eviction.auto",
    "kv_eviction.builtin_policies",
    "kv_eviction.candidate",
    "kv_eviction.chainheap",
    "kv_eviction.lru",
    "kv_eviction.marconi",
    "kv_eviction.policy",
    "kv_eviction.retention",
]


def test_serving_imports_no_harness_module() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SERVE], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == RUNTIME
