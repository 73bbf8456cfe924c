"""Retention hints: every policy keeps HIGH keys longest and drops LOW keys first."""

from __future__ import annotations

import pytest
from kv_eviction import ChainHeapPolicy, MarconiPolicy, make_policy
from kv_eviction.retention import Retention, parse_retention

POLICIES = [
    ("lru", {}),
    ("marconi", {}),
    ("marconi", {"decay": 0.1, "reuse_mode": "log"}),
    ("auto", {}),
]


@pytest.fixture(params=POLICIES, ids=lambda p: f"{p[0]}{p[1] or ''}")
def policy(request: pytest.FixtureRequest) -> ChainHeapPolicy:
    name, options = request.param
    built = make_policy(name, **options)
    assert isinstance(built, ChainHeapPolicy)
    return built


def test_high_keys_outlive_hotter_normal_keys_and_low_keys_go_first(
    policy: ChainHeapPolicy,
) -> None:
    policy.insert("system", retention=Retention.HIGH)
    for i in range(20):
        policy.insert(f"n{i}")
        policy.touch(f"n{i}")
        policy.tick()
    policy.insert("secret", retention=Retention.LOW)
    for i in range(20):
        policy.touch(f"n{i}")
    victims = policy.pop_victims(22)
    assert victims[0] == "secret"
    assert victims[-1] == "system"
    assert sorted(victims[1:-1]) == sorted(f"n{i}" for i in range(20))


def test_retention_survives_hits_and_can_be_raised(policy: ChainHeapPolicy) -> None:
    policy.insert("a")
    policy.insert("b", retention=Retention.HIGH)
    policy.touch("b")
    assert policy.retention("b") is Retention.HIGH
    policy.insert("c")
    policy.set_retention("a", Retention.HIGH)  # a normal request stored it, a later one keeps it
    assert policy.pop_victims(1) == ["c"]
    assert set(policy.pop_victims(2)) == {"a", "b"}


def test_a_high_chain_still_evicts_leaf_first(policy: ChainHeapPolicy) -> None:
    for depth, key in enumerate("xyz"):
        parent = "xyz"[depth - 1] if depth else None
        policy.insert(key, parent=parent, depth=depth, retention=Retention.HIGH)
    policy.insert("n")
    assert policy.pop_victims(4) == ["n", "z", "y", "x"]


def test_a_retention_class_leaves_marconi_scores_unchanged() -> None:
    policy = MarconiPolicy(decay=0.5)
    policy.insert("a", depth=3)
    policy.insert("b", depth=3, retention=Retention.HIGH)
    policy.insert("c", depth=3, retention=Retention.LOW)
    assert policy.score("a") == policy.score("b") == policy.score("c")


def test_auto_keeps_retention_across_a_rule_switch() -> None:
    policy = make_policy("auto")
    assert isinstance(policy, ChainHeapPolicy)
    for i in range(50):
        policy.insert(f"k{i}", retention=Retention.HIGH if i == 0 else Retention.NORMAL)
    policy.rescore(policy.candidate, 40)  # type: ignore[attr-defined]
    policy.start_rescore(policy.candidate, 30)  # type: ignore[attr-defined]
    policy.finish_rescore()  # type: ignore[attr-defined]
    assert policy.pop_victims(50)[-1] == "k0"


@pytest.mark.parametrize("bad", ["HIGH", "urgent", 2, None])
def test_parse_retention_names_the_key_and_the_accepted_values(bad: object) -> None:
    with pytest.raises(ValueError, match=r"offload_priority must be one of low, normal, high"):
        parse_retention(bad, "offload_priority")
    assert parse_retention("high") is Retention.HIGH
