"""The self-tuning `auto` policy: chain consistency while it switches, and its choices."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_eviction import AutoPolicy, make_policy
from kv_eviction._shadow import Shadow
from kv_eviction.auto import DEFAULT_CANDIDATES, RESCORE_STEP, Candidate
from kv_eviction.candidate import DOORKEEPER_LRU, CandidatePolicy
from kv_eviction.sim import simulate
from kv_eviction.sim.synthetic import GENERATORS, cycle, rag, sessions
from reference import SWITCH_EVERY_EPOCH, ReferencePolicy, random_workload

OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert"] * 4 + ["touch"] * 3 + ["pin", "unpin", "remove", "pop"]),
        st.integers(0, 10**6),
        st.integers(1, 4),
    ),
    max_size=300,
)


@settings(max_examples=80, deadline=None)
@given(ops=OPS)
def test_victims_stay_chain_consistent_while_the_rule_switches(
    ops: list[tuple[str, int, int]],
) -> None:
    policy = AutoPolicy(**SWITCH_EVERY_EPOCH)
    ref = ReferencePolicy("lru")  # used for eligibility only
    next_key = 0
    for op, pick, n in ops:
        keys = list(ref.entries)
        if op == "insert":
            parents = [None, *ref.eligible(), *keys]
            parent = parents[pick % len(parents)]
            depth = ref.entries[parent].depth + 1 if parent is not None else 0
            policy.insert(next_key, parent=parent, depth=depth)
            ref.insert(next_key, parent, depth)
            next_key += 1
        elif op == "pop":
            for victim in policy.pop_victims(n):
                assert victim in ref.eligible(), "victim pinned or still has a child"
                ref.remove(victim)
        elif keys:
            key = keys[pick % len(keys)]
            if op == "touch":
                policy.touch(key)
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
    for key, entry in ref.entries.items():
        for _ in range(entry.pins):
            policy.unpin(key)
        entry.pins = 0
    while ref.entries:
        (victim,) = policy.pop_victims(1)
        assert victim in ref.eligible()
        ref.remove(victim)


def test_auto_learns_frequency_on_zipf_rag_and_beats_lru() -> None:
    trace = rag(count=1500, documents=300)
    lru = simulate(trace, make_policy("lru"), 600)
    auto = AutoPolicy()
    result = simulate(trace, auto, 600)
    assert auto.current.reuse != "recency"
    assert result.token_hit_rate > lru.token_hit_rate + 0.01


def test_auto_stays_lru_where_recency_wins() -> None:
    trace = sessions(count=150)
    lru = simulate(trace, make_policy("lru"), 400)
    auto = AutoPolicy()
    result = simulate(trace, auto, 400)
    assert auto.current.name == "lru"
    assert result.token_hit_rate >= lru.token_hit_rate


@pytest.mark.parametrize(
    ("generator", "count", "capacity"),
    [("agents", 60, 150), ("sessions", 80, 300), ("rag", 800, 100)],
)
def test_auto_never_below_lru_on_small_synthetic_traces(
    generator: str, count: int, capacity: int
) -> None:
    trace = GENERATORS[generator](seed=3, count=count)
    lru = simulate(trace, make_policy("lru"), capacity)
    result = simulate(trace, AutoPolicy(), capacity)
    assert result.token_hit_rate >= lru.token_hit_rate


def test_candidate_keys() -> None:
    lfu = Candidate("f", reuse="linear", decay_per_turnover=1.0)
    assert lfu.log_key(uses=4, depth=0, last_use=100, capacity=100) == pytest.approx(
        1.3862943611198906 + 1.0
    )
    marconi = Candidate("m", reuse="linear", depth_weight=1.0)
    assert marconi.log_key(1, 3, 0, 10) == pytest.approx(-1.3862943611198906)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"sample_entries": 0}, "sample_entries"),
        ({"smoothing": 1.5}, "smoothing"),
        ({"min_discordant": -1}, "min_discordant"),
        ({"x": 1}, "'x'"),
    ],
)
def test_bad_options(options: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make_policy("auto", **options)


def test_rules_do_switch_under_random_load_and_victims_stay_leaves() -> None:
    """The property test's configuration really switches rules (so it tests switching)."""
    policy = AutoPolicy(**SWITCH_EVERY_EPOCH)
    random_workload(policy, ReferencePolicy("lru"), steps=3000, seed=0)
    assert policy.switches > 0


def test_an_incremental_switch_ends_in_the_new_rules_exact_order() -> None:
    lfu = Candidate("lfu", reuse="linear", decay_per_turnover=1.0)
    auto, reference = AutoPolicy(), CandidatePolicy(lfu, capacity=100)
    for policy in (auto, reference):
        for key in range(100):
            policy.insert(key)
        for key in range(100):
            for _ in range(key % 5):
                policy.touch(key)
    auto.start_rescore(lfu, 100)
    for _ in range(-(-100 // RESCORE_STEP)):  # enough operations to re-key 100 slots
        assert auto.pop_victims(0) == []
    assert auto.pop_victims(100) == reference.pop_victims(100)


def test_a_switch_to_a_doorkeeper_looks_up_the_keys_stored_before_it() -> None:
    """Keys stored under LRU were not looked up in the ghost; the re-scoring pass does it:
    afterwards the ones never hit and not remembered as evicted go first, oldest first,
    then the rest by recency."""
    auto = AutoPolicy()
    auto.set_ghost(100)
    assert auto.ghost is not None
    auto.ghost.add_all(range(0, 90, 2))  # even keys were cached and evicted before
    for key in range(100):
        auto.insert(key)
    for key in range(90, 100):
        auto.touch(key)  # hit: not first-time whatever the ghost says
    auto.start_rescore(DOORKEEPER_LRU, 100)
    for _ in range(-(-100 // RESCORE_STEP)):  # enough operations to re-key 100 slots
        assert auto.pop_victims(0) == []
    first_time = [key for key in range(90) if key not in auto.ghost]
    assert len(first_time) >= 40  # the odd keys, less the filter's false positives
    seen = [key for key in range(90) if key in auto.ghost]
    assert auto.pop_victims(100) == first_time + seen + list(range(90, 100))


@pytest.mark.parametrize("size", [1_000, 2_000, 10_000, 100_000])
def test_shadow_work_per_access_is_bounded_at_every_size(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed = 0
    real_replay = Shadow.replay

    def counted(shadow: Shadow, batch: list[tuple[object, int, int]]) -> int:
        nonlocal replayed
        replayed += len(batch)
        return real_replay(shadow, batch)

    monkeypatch.setattr(Shadow, "replay", counted)
    policy = AutoPolicy()
    for key in range(size):
        policy.insert(key)
    policy.pop_victims(1)  # full: the shadows start
    replayed = 0
    for key in range(size, size + 20_000):
        policy.insert(key)
        policy.pop_victims(1)
    # one in 2**shift keys is sampled and visits every shadow once: on average at most
    # `sample_budget` shadow accesses per access, whatever the size
    assert replayed <= 1.2 * policy.sample_budget * 20_000
    assert policy.sample_rate * len(policy.candidates) <= policy.sample_budget


def test_every_insert_and_touch_reaches_the_shadows_once_with_depth_and_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`auto` watches accesses through the heap's end-of-access hook, not a wrapper: every
    insert and touch is one sampled access (key, depth, clock of inserted blocks), in order."""
    seen: list[tuple[object, int, int]] = []
    real_replay = Shadow.replay

    def recorded(shadow: Shadow, batch: list[tuple[object, int, int]]) -> int:
        if shadow.candidate == DEFAULT_CANDIDATES[0]:
            seen.extend(batch)
        return real_replay(shadow, batch)

    monkeypatch.setattr(Shadow, "replay", recorded)
    policy = AutoPolicy(sample_budget=len(DEFAULT_CANDIDATES))  # R = 1: every key sampled
    expected = []
    for key in range(300):
        policy.insert(key, key - 1 if key % 3 else None, key % 3)
        expected.append((key, key % 3, key + 1))
        if key % 2:
            policy.touch(key // 2)
            expected.append((key // 2, key // 2 % 3, key + 1))
    policy.pop_victims(1)  # the capacity is read: queued accesses are replayed
    assert seen == expected


RULES = (
    *DEFAULT_CANDIDATES,
    Candidate("marconi-decay-1", reuse="linear", depth_weight=1.0, decay_per_turnover=1.0),
    Candidate("log-decay-4", reuse="log", decay_per_turnover=4.0),
)


def assert_shadow_hits_like_the_full_policy(
    accesses: list[tuple[int, int]], rule: Candidate, batch: int, capacity: int = 20
) -> None:
    """A `Shadow` of `rule` replaying `accesses` in batches hits exactly where a
    `CandidatePolicy` of the same rule and capacity does."""
    full = CandidatePolicy(rule, capacity=capacity)
    if rule.doorkeeper:
        full.set_ghost(capacity)
    shadow = Shadow(rule)
    shadow.resize(capacity, capacity)
    replayed: list[tuple[object, int, int]] = []
    expected = 0
    for i, (key, depth) in enumerate(accesses):
        if key in full:
            full.touch(key)
            expected |= 1 << i
        else:
            full.insert(key, depth=depth)
            if len(full) > capacity:
                full.pop_victims(1)
        replayed.append((key, depth, full.clock))
    hits = 0
    for start in range(0, len(replayed), batch):
        hits |= shadow.replay(replayed[start : start + batch]) << start
    assert hits == expected


@settings(max_examples=60, deadline=None)
@given(
    accesses=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 7)), min_size=1, max_size=600),
    rule=st.sampled_from(RULES),
    batch=st.integers(1, 80),
)
def test_a_shadow_hits_exactly_where_the_full_policy_does(
    accesses: list[tuple[int, int]], rule: Candidate, batch: int
) -> None:
    """The miniature's cheap cache is the same rule as `CandidatePolicy`, also when it
    replays the accesses in batches."""
    assert_shadow_hits_like_the_full_policy(accesses, rule, batch)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_a_shadow_hits_exactly_where_the_full_policy_does_through_many_evictions(
    rule: Candidate,
) -> None:
    """Each kind of shadow has its own replay loop with the victim choice written out;
    over thousands of evictions (hot keys that return, one-shot keys, a ghost that
    forgets, probation windows that run out) it still hits exactly where the full rule
    does."""
    rng = random.Random(7)
    accesses = [
        (rng.randrange(30) if rng.random() < 0.5 else rng.randrange(30, 600), rng.randrange(8))
        for _ in range(6000)
    ]
    assert_shadow_hits_like_the_full_policy(accesses, rule, batch=64, capacity=40)


def test_the_sampling_rate_spends_the_whole_budget() -> None:
    """R is `sample_budget` / K exactly (not rounded down to a power of two), so the
    shadows get every sampled access the budget pays for."""
    policy = AutoPolicy()
    for key in range(4096):
        policy.insert(key)
    policy.pop_victims(1)
    assert policy.sample_rate * len(policy.candidates) == pytest.approx(policy.sample_budget)


def test_auto_comes_within_half_a_point_of_the_best_named_rule_on_rag() -> None:
    """A lead that is clear in one epoch switches at once (the README's rag cell at 700
    blocks; at 1,400 `auto` first takes doorkeeper-lru, 0.9 points short of the best)."""
    trace = rag()
    best = max(
        simulate(trace, make_policy(name), 700).token_hit_rate
        for name in ("lru", "doorkeeper-lru", "doorkeeper-lfu-decay-1", "probation-lru")
    )
    assert simulate(trace, AutoPolicy(), 700).token_hit_rate >= best - 0.005


@pytest.mark.parametrize("name", ["lru", "auto", "doorkeeper-lru", "probation-lru"])
def test_heap_policies_keep_their_state_in_slots(name: str) -> None:
    """Past 30 instance attributes CPython stops sharing dict keys and every attribute
    access of the heap's hot path slows down; the heap policies' state lives in slots,
    also after switches (which create a ghost) and evictions."""
    policy = AutoPolicy(**SWITCH_EVERY_EPOCH) if name == "auto" else make_policy(name)
    random_workload(policy, ReferencePolicy("lru"), steps=3000, seed=0)
    assert set(vars(policy)) <= {"name"}  # RulePolicy names itself after its rule


def test_auto_keeps_part_of_every_session_when_sessions_cycle_beyond_the_cache() -> None:
    """24 sessions of ~45 blocks cycle through a 600-block cache: LRU, and every recency
    rule, evicts each session just before it comes back and hits nothing; the seed's
    Marconi rule keeps every session's first blocks. `auto` must find a rule that hits."""
    trace = cycle(count=24, context_tokens=640, turn_tokens=32, output_tokens=16, rounds=12)
    lru = simulate(trace, make_policy("lru"), 600).token_hit_rate
    marconi = simulate(trace, make_policy("marconi"), 600).token_hit_rate
    auto = AutoPolicy()
    rate = simulate(trace, auto, 600).token_hit_rate
    assert lru == 0.0
    assert marconi > 0.35
    assert rate > 0.2, f"auto {rate:.3f} on {auto.candidate.name}"


def test_auto_hits_sessions_in_a_cycle_from_the_first_warm_round() -> None:
    """Cold start: until the first hit `auto` keeps every session's first blocks (the
    Marconi shape), so the first warm round of a cycle longer than the cache hits as
    the Marconi rule does; starting as LRU it kept nothing there."""
    trace = cycle(count=24, context_tokens=640, turn_tokens=32, output_tokens=16, rounds=2)
    marconi = simulate(trace, make_policy("marconi"), 600).token_hit_rate
    rate = simulate(trace, AutoPolicy(), 600).token_hit_rate
    assert marconi > 0.25
    assert rate >= marconi - 0.005, f"auto {rate:.3f}, marconi {marconi:.3f}"


def test_auto_cold_start_becomes_lru_at_a_hit_before_any_eviction() -> None:
    """A hit before the cache ever filled: every rule holds the same keys, so the cold
    rule gives way to `lru` (by the first eviction) at no cost."""
    auto = AutoPolicy()
    assert auto.current.depth_weight > 0  # cold: the Marconi shape
    for key in range(100):
        auto.insert(key)
    auto.touch(5)
    auto.pop_victims(1)
    assert auto.current.name == "lru"


def test_auto_cold_start_stays_on_trial_after_evictions() -> None:
    """A first hit after evictions keeps the cold rule; the shadows decide from there."""
    auto = AutoPolicy()
    for key in range(4096):
        auto.insert(key)
    for key in range(4096, 8192):
        auto.pop_victims(1)
        auto.insert(key)
    auto.touch(8000)
    assert auto.current.depth_weight > 0


class _FeedsShadow:
    """Wraps a full-size rule policy and feeds every access it sees to a shadow of the
    same rule holding as many keys (a sample rate of 1)."""

    def __init__(self, name: str, candidate: Candidate, capacity: int) -> None:
        self.policy = make_policy(name)
        self.shadow = Shadow(candidate)
        self.capacity = capacity
        self.shadow_hits = self.policy_hits = 0

    def insert(self, key: object, parent: object = None, depth: int = 0) -> None:
        self.policy.insert(key, parent, depth)
        self.shadow_hits += self.shadow.replay([(key, depth, 0)])

    def touch(self, key: object) -> None:
        self.policy.touch(key)
        self.policy_hits += 1
        self.shadow_hits += self.shadow.replay([(key, 0, 0)])

    def pop_victims(self, n: int) -> list[object]:
        if not self.shadow.capacity:  # the first eviction tells the capacity
            self.shadow.resize(self.capacity, self.capacity)
        return self.policy.pop_victims(n)

    def __len__(self) -> int:
        return len(self.policy)

    def __contains__(self, key: object) -> bool:
        return key in self.policy

    def __getattr__(self, name: str) -> object:
        return getattr(self.policy, name)


@pytest.mark.parametrize("name", ["doorkeeper-lru", "doorkeeper-lfu-decay-1"])
def test_a_doorkeeper_shadow_hits_as_its_rule_does_from_the_first_insert(name: str) -> None:
    """Before the first eviction every stored block is first-time, in the main cache
    and in its shadow alike: sessions in a cycle longer than the cache hit nothing under
    a doorkeeper, and its shadow must say so (when it kept the first blocks as seen
    before, `auto` took a doorkeeper's false lead on the first warm round)."""
    candidate = next(c for c in DEFAULT_CANDIDATES if c.name == name)
    trace = cycle(count=24, context_tokens=640, turn_tokens=32, output_tokens=16, rounds=3)
    fed = _FeedsShadow(name, candidate, 600)
    simulate(trace, lambda _: fed, 600)
    assert fed.policy_hits == 0
    assert fed.shadow_hits == 0
