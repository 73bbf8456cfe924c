"""`nox -l` shows each session's docstring up to its first line break: that line must be
the whole summary, not half a sentence."""

from __future__ import annotations

import ast
from pathlib import Path

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"


def _sessions() -> dict[str, str]:
    """Docstrings of the noxfile's functions decorated with `nox.session`."""
    found = {}
    for node in ast.parse(NOXFILE.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any(
            "session" in ast.unparse(decorator) for decorator in node.decorator_list
        ):
            found[node.name] = ast.get_docstring(node, clean=False) or ""
    return found


def test_each_session_summary_is_its_first_line() -> None:
    sessions = _sessions()
    assert "demo" in sessions
    cut = {
        name: doc.split("\n")[0]
        for name, doc in sessions.items()
        if not doc or ("\n" in doc and doc.split("\n")[1].strip())
    }
    assert cut == {}, "first line continues on the next: end it, then a blank line"
