"""The serving benchmark's summary (`run_serving.py --summarize`) over committed GPU results:
runs of one mode under different `load_mode`s stay apart, each is compared with none, and
TTFT is split between requests that reused their session's history and the others."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")  # the benchmark's client; present wherever vLLM is
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "serving"))
import run_serving  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "h100-2026-12-07c" / "serving"


def test_runs_of_one_mode_under_two_load_modes_are_two_rows(tmp_path: Path) -> None:
    folders = [RESULTS / tag for tag in ("serving-h", "serving-i", "serving-j")]
    rows = run_serving.summarize(folders, tmp_path)
    labels = [run_serving.report.run_label(row) for row in rows]
    assert labels == ["none", "native", "ours", "ours:same_step"]
    for row in rows[1:]:
        assert row["identical_to_none"]["compared"] == 116
    table = (tmp_path / "summary.txt").read_text()
    assert "ours:same_step" in table
    # random weights: every offload's first token agrees; where none's parts, it parts alike
    assert (
        "r2: first tokens of native, ours, ours:same_step agree with each other at 116 of 116; "
        "at 12/2, 29/0, 34/2 one or more part from the none run's"
    ) in table


def test_ttft_is_split_by_whether_a_request_reused_its_history(tmp_path: Path) -> None:
    rows = run_serving.summarize([RESULTS / "serving-h"], tmp_path)
    none, ours = rows
    # an offload keeps histories HBM dropped: more requests reuse theirs than without one
    assert (
        none["ttft_by_reuse"]["reused"]["requests"],
        ours["ttft_by_reuse"]["reused"]["requests"],
    ) == (55, 77)
    for row in rows:
        split = row["ttft_by_reuse"]
        assert split["reused"]["requests"] + split["fresh"]["requests"] == row["completed"]
        assert split["reused"]["ttft_p50"] < split["fresh"]["ttft_p50"]
    assert (
        "requests with more than the system prompt cached" in (tmp_path / "summary.txt").read_text()
    )
