"""`auto`'s doorkeeper rules and the ghost filter behind them."""

from __future__ import annotations

import random

import pytest
from kv_eviction import AutoPolicy, make_policy
from kv_eviction._ghost import Ghost
from kv_eviction.auto import Candidate, CandidatePolicy
from kv_eviction.candidate import PROBATION_LRU, RulePolicy
from kv_eviction.sim import simulate
from kv_eviction.sim.trace import Request, Trace
from reference import SWITCH_EVERY_EPOCH, ReferencePolicy, random_workload

DOORKEEPER = Candidate("doorkeeper-lru", reuse="recency", doorkeeper=True)
LRU = Candidate("lru", reuse="recency")


def test_ghost_remembers_the_last_window_and_forgets_older_keys() -> None:
    ghost = Ghost(1000)
    for key in range(1000):
        ghost.add(key)
    assert all(key in ghost for key in range(1000))  # no false negatives
    for key in range(1000, 3000):
        ghost.add(key)  # two more generations: the first 1,000 keys are dropped
    assert all(key in ghost for key in range(2000, 3000))
    forgotten = sum(key in ghost for key in range(1000))
    assert forgotten < 150  # only false positives remain (about 7% with both generations full)


def test_ghost_add_all_is_add_in_order_across_generations() -> None:
    """Evictions enter the ghost a batch at a time (`add_all`); the filter is the one
    that adding them one by one makes, also where a batch starts a new generation."""
    one_by_one, batched = Ghost(100), Ghost(100)
    for start in range(0, 450, 70):
        keys = range(start, start + 70)
        for key in keys:
            one_by_one.add(key)
        batched.add_all(keys)
        assert batched.generations == one_by_one.generations


def test_ghost_false_positive_rate() -> None:
    rng = random.Random(0)  # fixed keys: string hashes change per process
    keys = [rng.getrandbits(64) for _ in range(20_000)]
    ghost = Ghost(10_000)
    for key in keys[:10_000]:
        ghost.add(key)
    false = sum(key in ghost for key in keys[10_000:])
    assert false < 450  # ~3.5% for one full generation


def test_ghost_rejects_an_empty_window() -> None:
    with pytest.raises(ValueError, match="window"):
        Ghost(0)


def test_first_time_blocks_go_first_and_a_returning_block_is_ordered_by_recency() -> None:
    policy = CandidatePolicy(DOORKEEPER, capacity=3)
    policy.set_ghost(3)
    policy.insert("x")
    policy.insert("y")
    assert policy.pop_victims(1) == ["x"]  # first-timers leave oldest first
    policy.insert("x")  # evicted before, so seen before: an ordinary LRU entry
    policy.insert("z")  # first time
    assert policy.pop_victims(3) == ["y", "z", "x"]  # LRU would give y, x, z


def test_a_hit_ends_probation() -> None:
    policy = CandidatePolicy(DOORKEEPER, capacity=3)
    policy.set_ghost(3)
    policy.insert("a")
    policy.insert("b")
    policy.touch("a")
    assert policy.pop_victims(2) == ["b", "a"]


def test_a_block_under_a_new_prefix_is_new_and_chains_stay_consistent() -> None:
    policy = CandidatePolicy(DOORKEEPER, capacity=4)
    policy.set_ghost(4)
    policy.insert("old")
    policy.insert("seen")
    assert policy.pop_victims(2) == ["old", "seen"]
    policy.insert("seen")  # seen before: ordinary LRU entry
    policy.insert("root")  # first time
    policy.insert("old", parent="root", depth=1)  # its prefix is new, so it is new too
    policy.insert("new")  # first time
    # first-timers oldest first, but the root only once its child is gone
    assert policy.pop_victims(4) == ["old", "root", "new", "seen"]


def _scan_with_a_hot_set(rounds: int, hot_chains: int = 30) -> Trace:
    """`hot_chains` chains of 4 blocks requested round-robin, 3 one-shot chains after each.

    A hot chain returns after 16 x `hot_chains` block stores, so LRU holding fewer never
    hits; the hot set (4 x `hot_chains` blocks) fits if the one-shot chains go first.
    """
    requests: list[Request] = []
    one_shot = 10**6
    for _ in range(rounds):
        for hot in range(hot_chains):
            requests.append(Request(len(requests), tuple((hot, i) for i in range(4)), 4 * 16))
            for _ in range(3):
                blocks = tuple((one_shot, i) for i in range(4))
                requests.append(Request(len(requests), blocks, 4 * 16))
                one_shot += 1
    return Trace("scan", 16, requests)


def test_auto_switches_to_a_doorkeeper_under_scans_and_beats_lru() -> None:
    trace = _scan_with_a_hot_set(rounds=12, hot_chains=150)  # hot set 600 blocks
    lru = simulate(trace, make_policy("lru"), 1000)
    auto = AutoPolicy()
    result = simulate(trace, auto, 1000)
    assert lru.token_hit_rate == 0.0
    assert auto.current.doorkeeper
    assert result.token_hit_rate > 0.1


def test_victims_stay_leaves_while_doorkeeper_rules_switch_and_keys_return() -> None:
    policy = AutoPolicy(
        candidates=(LRU, DOORKEEPER, Candidate("dk-lfu", decay_per_turnover=1.0, doorkeeper=True)),
        **SWITCH_EVERY_EPOCH,
    )
    ref = ReferencePolicy("lru")
    random_workload(policy, ref, steps=4000, seed=1, returning_keys=True)
    assert policy.switches > 0
    while ref.entries:
        (victim,) = policy.pop_victims(1)
        assert victim in ref.eligible()
        ref.remove(victim)


def test_the_ghost_exists_only_from_a_doorkeeper_lead_until_a_switch_away() -> None:
    policy = AutoPolicy()
    for key in range(100):
        policy.insert(key)
    policy.pop_victims(1)  # full: capacity known, shadows start
    assert policy.ghost is None  # LRU current, no doorkeeper has led
    names = [c.name for c in policy.candidates]
    policy._switch(names.index("doorkeeper-lru"))
    assert policy.ghost is not None
    assert policy.ghost.window == 4 * 100  # 4 turnovers of the capacity (100 keys)
    policy._switch(names.index("doorkeeper-lfu-decay-1"))
    assert policy.ghost is not None  # still a doorkeeper
    policy._switch(0)
    assert policy.ghost is None


def test_probation_keeps_a_first_time_block_for_its_window_then_it_goes_first() -> None:
    def run(rule: Candidate) -> list[object]:
        policy = CandidatePolicy(rule, capacity=20)  # probation-lru's window: 2 inserts
        policy.set_ghost(20)
        assert policy.ghost is not None
        policy.ghost.add("seen")
        policy.insert("seen")  # stored before: an ordinary LRU entry
        policy.insert("new")  # first time
        victims = policy.pop_victims(1)
        policy.insert("a")
        policy.insert("b")  # "new" is now 2 inserts old: out of its window
        return victims + policy.pop_victims(1)

    assert run(PROBATION_LRU) == ["seen", "new"]  # "new" survives its window, then goes
    assert run(DOORKEEPER) == ["new", "a"]  # the doorkeeper evicts first-timers at once


@pytest.mark.parametrize("name", ["doorkeeper-lru", "doorkeeper-lfu-decay-1", "probation-lru"])
def test_named_rules_are_policies_that_stay_chain_consistent(name: str) -> None:
    policy = make_policy(name)
    assert isinstance(policy, RulePolicy)
    assert policy.name == name
    ref = ReferencePolicy("lru")
    random_workload(policy, ref, steps=3000, seed=2, returning_keys=True)
    assert policy.ghost is not None  # capacity read at the first eviction
    while ref.entries:
        (victim,) = policy.pop_victims(1)
        assert victim in ref.eligible()
        ref.remove(victim)
    with pytest.raises(ValueError, match="accepted options: none"):
        make_policy(name, decay=0.1)
