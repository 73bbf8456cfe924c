"""The `kv-eviction` command line."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import kv_eviction
import pytest
from kv_eviction.sim.cli import main, parse_policy_spec


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
        (["--reuse-mode", "cubic"], "option --reuse-mode must be one of linear, log, none"),
        (["--decay", "-1"], "option --decay must be"),
        (["--trace", "missing/trace.jsonl"], "option --trace: no such file: 'missing/trace.jsonl'"),
        (["--trace", "missing.json"], "option --trace: no such file"),
        (["--sweep", "--policies", "lru,marconi:cubic"], "option --policies: "),
    ],
)
def test_bad_options_are_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--limit", "5", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1  # one line, no traceback


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kv-eviction {kv_eviction.__version__}\n"


def test_plot_without_matplotlib_fails_before_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code = main(["simulate", "--trace", "rag", "--sweep", "--plot", str(tmp_path / "x.png")])
    captured = capsys.readouterr()
    assert code == 2
    assert "option --plot needs matplotlib" in captured.err
    assert "kv-eviction[plot]" in captured.err
    assert captured.out == ""  # nothing was simulated


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_sweep_shows_progress_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", "rag", "--limit", "30", "--capacity", "20,40", "--sweep",
            "--policies", "lru,marconi"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # not a terminal: no bar
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    bar = terminal.getvalue()
    assert "simulate:" in bar
    assert "/4 " in bar  # 2 policies x 2 capacities
    assert "marconi @ 40 blocks" in bar  # the cell being run


def test_policy_specs() -> None:
    assert parse_policy_spec("marconi:log:0.01")[0] == "marconi:log:0.01"
    with pytest.raises(ValueError, match="reuse_mode"):
        parse_policy_spec("marconi:bogus")
    with pytest.raises(ValueError, match="decay"):
        parse_policy_spec("marconi:log:fast")
