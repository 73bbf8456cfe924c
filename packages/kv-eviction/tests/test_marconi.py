"""Marconi scores, options and tie-breaking on hand-checkable cases."""

from __future__ import annotations

import math

import pytest
from kv_eviction import MarconiPolicy, make_policy


def test_deeper_blocks_go_first_at_equal_reuse() -> None:
    p = make_policy("marconi", reuse_mode="none")
    p.insert("root")
    p.insert("other", depth=3)  # an unrelated chain's deep block
    p.insert("mid", depth=1)
    assert p.pop_victims(3) == ["other", "mid", "root"]


def test_linear_reuse_protects_hot_blocks() -> None:
    p = MarconiPolicy(reuse_mode="linear")
    p.insert("hot")
    p.insert("cold")
    for _ in range(3):
        p.touch("hot")
    assert p.score("hot") == 4.0
    assert p.score("cold") == 1.0
    assert p.pop_victims(1) == ["cold"]


def test_log_reuse_compresses_counts() -> None:
    p = MarconiPolicy(reuse_mode="log")
    p.insert("a", depth=1)
    p.touch("a")
    assert p.score("a") == pytest.approx(math.log1p(2) / 2)


def test_decay_ages_blocks_by_ticks() -> None:
    p = MarconiPolicy(decay=0.5, reuse_mode="linear")
    p.insert("old")
    p.touch("old")  # uses 2
    p.tick(4)
    p.insert("new")  # uses 1, age 0
    assert p.score("old") == pytest.approx(2 * math.exp(-2.0))
    assert p.pop_victims(1) == ["old"]  # 0.27 < 1.0


def test_ties_go_to_least_recently_used() -> None:
    p = MarconiPolicy(reuse_mode="linear")
    p.insert("x", depth=1)  # 1 / 2
    p.insert("y")
    p.touch("y")
    p.insert("z", depth=3)
    p.touch("z")  # 2 / 4 = 1/2
    p.touch("x")  # now 2 / 2 = 1: x leaves the tie
    p.insert("w", depth=1)  # 1 / 2, newest
    assert p.pop_victims(2) == ["z", "w"]


def test_scores_stay_ordered_where_the_formula_underflows() -> None:
    p = MarconiPolicy(decay=1.0)
    p.insert("a")
    p.touch("a")  # score 2
    p.tick(1000)
    p.insert("b")
    p.tick(1000)  # both exp() terms underflow to 0.0; a is older, so lower
    assert p.score("a") == 0.0
    assert p.score("b") == 0.0
    assert p.pop_victims(1) == ["a"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"reuse_mode": "square"}, "reuse_mode"),
        ({"decay": -0.1}, "decay"),
        ({"decay": float("nan")}, "decay"),
        ({"decay": "0.1"}, "decay"),
        ({"alpha": 1}, "alpha"),
    ],
)
def test_bad_options_name_the_option_and_accepted_values(
    options: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as info:
        make_policy("marconi", **options)
    assert "linear" in str(info.value) or ">= 0" in str(info.value) or "decay" in str(info.value)


def test_unknown_policy_lists_the_accepted_names() -> None:
    with pytest.raises(ValueError, match="lru, marconi"):
        make_policy("arc")


def test_lru_takes_no_options() -> None:
    with pytest.raises(ValueError, match="'decay'"):
        make_policy("lru", decay=0.1)
