"""Rendezvous hashing."""

from __future__ import annotations

from memkv_client.routing import Router, hrw_score

KEYS = [f"model/block/{i}".encode() for i in range(3000)]


def test_scores_are_stable_across_processes() -> None:
    # fixed value: routing must never change between releases or Python processes
    assert hrw_score("127.0.0.1:9900", b"k") == hrw_score("127.0.0.1:9900", b"k")
    assert hrw_score("a:1", b"k") != hrw_score("b:1", b"k")


def test_adding_a_server_moves_about_one_nth() -> None:
    three = Router(["a:1", "b:1", "c:1"])
    four = Router(["a:1", "b:1", "c:1", "d:1"])
    moved = [k for k in KEYS if three.servers[three.route(k)] != four.servers[four.route(k)]]
    assert 0.18 < len(moved) / len(KEYS) < 0.32  # expected 1/4
    assert all(four.servers[four.route(k)] == "d:1" for k in moved)  # only onto the new one


def test_removing_a_server_moves_only_its_keys() -> None:
    three = Router(["a:1", "b:1", "c:1"])
    two = Router(["a:1", "c:1"])
    for k in KEYS:
        before = three.servers[three.route(k)]
        if before != "b:1":
            assert two.servers[two.route(k)] == before


def test_order_of_the_server_list_does_not_matter() -> None:
    r1, r2 = Router(["a:1", "b:1", "c:1"]), Router(["c:1", "a:1", "b:1"])
    assert all(r1.servers[r1.route(k)] == r2.servers[r2.route(k)] for k in KEYS)


def test_group_keeps_input_order_and_rank_agrees() -> None:
    r = Router(["a:1", "b:1", "c:1"])
    groups = r.group(KEYS[:100])
    assert sorted(p for ps in groups.values() for p in ps) == list(range(100))
    for server, positions in groups.items():
        assert positions == sorted(positions)
        assert all(r.rank(KEYS[p])[0] == server for p in positions)
