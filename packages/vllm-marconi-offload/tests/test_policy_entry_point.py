"""`eviction_policy` names a policy that another installed distribution declares as a
`kv_eviction.policies` entry point, with no code change here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "kv-eviction" / "tests"))
from policy_distribution import POLICY, install_policy_distribution

CONFIGURE = f"""
from kv_eviction import make_policy
from vllm_marconi_offload.config import ConfigError, OffloadConfig
config = OffloadConfig.from_extra_config({{"eviction_policy": {POLICY!r}}})
policy = make_policy(config.eviction_policy, **config.eviction_options)
try:
    OffloadConfig.from_extra_config(
        {{"eviction_policy": {POLICY!r}, "eviction_options": {{"grace": 1}}}}
    )
except ConfigError as exc:
    print(type(policy).__module__, type(policy).__name__, exc, sep="|")
"""


def test_eviction_policy_names_an_installed_distributions_policy(tmp_path: Path) -> None:
    site = install_policy_distribution(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", CONFIGURE], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    module, cls, error = result.stdout.strip().split("|")
    assert (module, cls) == ("tenant_policies", "TenantLRU")
    assert "eviction_options" in error
    assert "takes no options; got ['grace']" in error
