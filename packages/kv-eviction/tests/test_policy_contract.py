"""The interface contract, run against every installed policy (the built-ins and any other
distribution's `kv_eviction.policies` entry points)."""

from __future__ import annotations

import pytest
from kv_eviction import EvictionPolicy, make_policy, policy_names

POLICIES = policy_names()


@pytest.fixture(params=POLICIES)
def policy(request: pytest.FixtureRequest) -> EvictionPolicy:
    return make_policy(request.param)


def test_the_built_ins_are_installed() -> None:
    assert {"auto", "lru", "marconi"} <= set(POLICIES)


def test_len_contains_and_remove(policy: EvictionPolicy) -> None:
    policy.insert("a")
    policy.insert("b", parent="a", depth=1)
    assert len(policy) == 2
    assert "a" in policy
    assert "b" in policy
    assert "c" not in policy
    assert [] not in policy  # unhashable: simply not tracked
    policy.remove("b")
    assert "b" not in policy
    assert len(policy) == 1
    with pytest.raises(KeyError, match="not tracked"):
        policy.remove("b")


def test_double_insert_and_unknown_keys_raise(policy: EvictionPolicy) -> None:
    policy.insert("a")
    with pytest.raises(KeyError, match="already tracked"):
        policy.insert("a")
    for op in (policy.touch, policy.pin, policy.unpin, policy.remove):
        with pytest.raises(KeyError):
            op("zz")


def test_a_chain_is_evicted_leaf_first(policy: EvictionPolicy) -> None:
    chain = [f"b{i}" for i in range(5)]
    for depth, key in enumerate(chain):
        policy.insert(key, parent=chain[depth - 1] if depth else None, depth=depth)
    for key in chain:  # hits walk the prefix root first: the root is the oldest touch
        policy.touch(key)
    assert policy.pop_victims(10) == chain[::-1]
    assert len(policy) == 0


def test_pinned_keys_are_never_victims_and_pins_nest(policy: EvictionPolicy) -> None:
    policy.insert("a")
    policy.insert("b")
    policy.pin("a")
    policy.pin("a")
    assert policy.pop_victims(5) == ["b"]
    policy.unpin("a")
    assert policy.pop_victims(5) == []
    policy.unpin("a")
    assert policy.pop_victims(5) == ["a"]


def test_unpin_of_unpinned_key_raises(policy: EvictionPolicy) -> None:
    policy.insert("a")
    with pytest.raises(ValueError, match="not pinned"):
        policy.unpin("a")


def test_pinned_leaf_blocks_its_whole_chain(policy: EvictionPolicy) -> None:
    policy.insert("a")
    policy.insert("b", parent="a", depth=1)
    policy.pin("b")
    assert policy.pop_victims(5) == []
    policy.unpin("b")
    assert policy.pop_victims(5) == ["b", "a"]


def test_untracked_parent_makes_a_root(policy: EvictionPolicy) -> None:
    policy.insert("b", parent="gone", depth=3)
    assert policy.pop_victims(1) == ["b"]


def test_removing_a_parent_frees_children_and_slots_stay_consistent(
    policy: EvictionPolicy,
) -> None:
    policy.insert("a")
    policy.insert("b", parent="a", depth=1)
    policy.remove("a")  # b is now a root; a's slot must not be reused while b points at it
    for i in range(10):
        policy.insert(i)
    policy.remove("b")
    assert sorted(policy.pop_victims(100), key=str) == sorted(range(10), key=str)


def test_stats_count_operations(policy: EvictionPolicy) -> None:
    policy.insert("a")
    policy.insert("b")
    policy.touch("a")
    policy.pin("a")
    policy.tick(3)
    policy.pop_victims(1)
    policy.remove("a")
    st = policy.stats()
    assert (st.inserts, st.touches, st.evictions, st.removals) == (2, 1, 1, 1)
    assert (st.entries, st.pinned, st.now, st.policy) == (0, 0, 3, policy.name)


def test_heap_garbage_stays_bounded(policy: EvictionPolicy) -> None:
    for i in range(100):
        policy.insert(i)
    for _ in range(200):
        for i in range(100):
            policy.touch(i)
    st = policy.stats()
    assert st.compactions > 0
    assert st.heap_size <= 2 * 100 + 1024
    assert policy.pop_victims(1000) == list(range(100))
