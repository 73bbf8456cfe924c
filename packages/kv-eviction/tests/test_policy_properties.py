"""Random workloads against the brute-force reference: chain consistency, pins and the
exact minimum, for both policies."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_eviction import make_policy
from reference import ReferencePolicy

CONFIGS = [
    ("lru", {}),
    ("marconi", {"reuse_mode": "linear", "decay": 0.0}),
    ("marconi", {"reuse_mode": "log", "decay": 0.3}),
    ("marconi", {"reuse_mode": "none", "decay": 0.05}),
]

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "insert", "insert", "touch", "pin", "unpin", "remove", "tick", "pop"]
        ),
        st.integers(0, 10**6),
        st.integers(1, 4),
    ),
    max_size=120,
)


def _check_victim(ref: ReferencePolicy, victim: object) -> None:
    """The victim is eligible and has the minimum reference score (LRU on ties)."""
    eligible = ref.eligible()
    assert victim in eligible, "victim is pinned or still has a tracked child"
    scores = {k: ref.score(k) for k in eligible}
    best = min(scores.values())
    assert math.isclose(scores[victim], best, rel_tol=1e-9, abs_tol=0.0) or scores[victim] == best
    near = [k for k, s in scores.items() if math.isclose(s, best, rel_tol=1e-9)]
    clear_winner = [k for k in near if not math.isclose(scores[k], best, rel_tol=1e-12)] == []
    if clear_winner and all(scores[k] == best for k in near):
        assert ref.entries[victim].last_seq == min(ref.entries[k].last_seq for k in near)


def _run(config: int, ops: list[tuple[str, int, int]]) -> None:
    name, options = CONFIGS[config]
    policy = make_policy(name, **options)
    ref = ReferencePolicy(name, **options)
    next_key = 0
    for op, pick, n in ops:
        keys = sorted(ref.entries, key=lambda k: ref.entries[k].last_seq)
        if op == "insert":
            parents = [None, *ref.eligible(), *keys]  # leaves most often: chains grow
            parent = parents[pick % len(parents)]
            depth = ref.entries[parent].depth + 1 if parent is not None else pick % 3
            policy.insert(next_key, parent=parent, depth=depth)
            ref.insert(next_key, parent, depth)
            next_key += 1
        elif op == "tick":
            policy.tick(n)
            ref.now += n
        elif op == "pop":
            victims = policy.pop_victims(n)
            assert len(victims) <= n
            for victim in victims:
                _check_victim(ref, victim)
                ref.remove(victim)
            if len(victims) < n:
                assert ref.eligible() == [], "pop_victims stopped while a key was eligible"
        elif keys:
            key = keys[pick % len(keys)]
            if op == "touch":
                policy.touch(key)
                ref.touch(key)
            elif op == "pin":
                policy.pin(key)
                ref.entries[key].pins += 1
            elif op == "unpin" and ref.entries[key].pins:
                policy.unpin(key)
                ref.entries[key].pins -= 1
            elif op == "remove":
                policy.remove(key)
                ref.remove(key)
        assert len(policy) == len(ref.entries)
        assert all(k in policy for k in ref.entries)
    # drain: everything unpinned must come out leaf-first, in reference order
    for key, entry in ref.entries.items():
        for _ in range(entry.pins):
            policy.unpin(key)
        entry.pins = 0
    while ref.entries:
        (victim,) = policy.pop_victims(1)
        _check_victim(ref, victim)
        ref.remove(victim)
    assert len(policy) == 0
    assert policy.pop_victims(1) == []


@settings(max_examples=150, deadline=None)
@given(config=st.integers(0, len(CONFIGS) - 1), ops=OPS)
def test_random_workloads_match_the_reference(config: int, ops: list[tuple[str, int, int]]) -> None:
    _run(config, ops)


@settings(max_examples=60, deadline=None)
@given(
    config=st.integers(0, len(CONFIGS) - 1),
    hits=st.lists(st.integers(0, 30), min_size=1, max_size=200),
    capacity=st.integers(2, 12),
)
def test_prefix_cache_never_orphans_a_block(config: int, hits: list[int], capacity: int) -> None:
    """Replay chains like a prefix cache: every cached block's parent stays cached."""
    name, options = CONFIGS[config]
    policy = make_policy(name, **options)
    parent_of: dict[tuple[int, int], tuple[int, int] | None] = {}
    for request in hits:
        chain = [(request % 7, d) for d in range(1 + request % 5)]  # 7 prompts, shared roots
        chain = [(0, 0), *[(c, d + 1) for c, d in chain]]  # a system-prompt block for all
        prev = None
        for depth, key in enumerate(chain):
            if key in policy:
                policy.touch(key)
            else:
                if len(policy) >= capacity:
                    if prev is not None:
                        policy.pin(prev)
                    policy.pop_victims(1)
                    if prev is not None:
                        policy.unpin(prev)
                    if len(policy) >= capacity:
                        break
                policy.insert(key, parent=prev, depth=depth)
                parent_of[key] = prev
            prev = key
            policy.tick()
        for key, parent in parent_of.items():
            if key in policy and parent is not None:
                assert parent in policy, f"{key} is cached but its parent {parent} is not"
