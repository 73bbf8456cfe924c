"""The `kv-eviction` command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from kv_eviction.cli import main, parse_policy_spec


def test_simulate_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--trace", "agents", "--limit", "15", "--capacity", "40,80"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| marconi:linear:0 | 40 |" in out
    assert "| marconi:linear:0 | 80 |" in out
    assert "token hit" in out


def test_sweep_compares_policies_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "sweep.png"
    code = main(
        ["simulate", "--trace", "rag", "--limit", "100", "--sweep",
         "--policies", "lru,marconi:log:0.01,belady", "--plot", str(png)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "| token hit rate |" in out
    assert "| belady |" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "nope"], "option --trace"),
        (["--capacity", "x"], "option --capacity"),
        (["--reuse-mode", "cubic"], "option 'reuse_mode'"),
        (["--decay", "-1"], "option 'decay'"),
    ],
)
def test_bad_options_are_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--limit", "5", *argv]) == 2
    assert message in capsys.readouterr().err


def test_policy_specs() -> None:
    assert parse_policy_spec("marconi:log:0.01")[0] == "marconi:log:0.01"
    with pytest.raises(ValueError, match="reuse_mode"):
        parse_policy_spec("marconi:bogus")
    with pytest.raises(ValueError, match="decay"):
        parse_policy_spec("marconi:log:fast")
