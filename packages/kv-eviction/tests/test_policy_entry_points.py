"""kv-eviction's own policies are registered in code and need no installed metadata; a
policy of another installed distribution comes through the `kv_eviction.policies`
entry-point group, named with no code change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kv_eviction import (
    ENTRY_POINT_GROUP,
    EvictionPolicy,
    make_policy,
    policy_names,
    register_policy,
)
from policy_distribution import POLICY, install_policy_distribution

SRC = Path(__file__).resolve().parents[1] / "src"
BUILT_INS = ["auto", "doorkeeper-lfu-decay-1", "doorkeeper-lru", "lru", "marconi", "probation-lru"]
FROM_SOURCES = f"""
from importlib.metadata import entry_points
import kv_eviction
from kv_eviction import make_policy, validate_policy
print(kv_eviction.__file__)
print(list(entry_points(group={ENTRY_POINT_GROUP!r})))
for name in {BUILT_INS!r}:
    print(make_policy(name).stats().policy)
try:
    validate_policy("nope")
except ValueError as exc:
    print(exc)
"""
USE_INSTALLED = f"""
from kv_eviction import make_policy, policy_names, validate_policy
assert {POLICY!r} in policy_names(), policy_names()
policy = make_policy({POLICY!r})
policy.insert("a")
policy.insert("b", parent="a", depth=1)
assert policy.pop_victims(2) == ["b", "a"]
try:
    validate_policy({POLICY!r}, {{"grace": 1}})
except ValueError as exc:
    print(type(policy).__module__, type(policy).__name__, policy.stats().policy, exc, sep="|")
"""


def test_the_built_ins_are_registered() -> None:
    assert set(BUILT_INS) <= set(policy_names())
    for name in BUILT_INS:
        policy = make_policy(name)
        assert isinstance(policy, EvictionPolicy)
        assert policy.name == name


def test_the_built_ins_work_from_sources_without_installed_metadata() -> None:
    # -S: no site-packages, so no dist-info (kv-eviction's or any other) can be seen
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(SRC)
    result = subprocess.run(
        [sys.executable, "-S", "-c", FROM_SOURCES], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    names = ", ".join(BUILT_INS)
    assert result.stdout.splitlines() == [
        f"{SRC / 'kv_eviction' / '__init__.py'}",
        "[]",
        *BUILT_INS,
        f"eviction policy 'nope' is unknown; accepted values: {names}",
    ]


def test_a_policy_of_another_distribution_is_found_by_name(tmp_path: Path) -> None:
    site = install_policy_distribution(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", USE_INSTALLED], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert result.stdout.strip().split("|") == [
        "tenant_policies",
        "TenantLRU",
        POLICY,
        "eviction policy 'tenant-lru' takes no options; got ['grace']",
    ]


def test_a_factory_that_builds_no_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kv_eviction.policy._REGISTRY", {})
    register_policy("not-a-policy", lambda **options: object())
    with pytest.raises(TypeError, match="'not-a-policy': its factory returned object"):
        make_policy("not-a-policy")
