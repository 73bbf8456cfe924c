"""Test files that one pytest run collects together have distinct names.

The test folders have no `__init__.py`, so pytest imports each file under its bare name:
two `test_kv_events.py` in one run stop collection ("import file mismatch"). The nox
`integration` session collects the vLLM plugins' suites and tests-integration/ together.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTED_TOGETHER = [
    ROOT / "packages" / "memkv-vllm" / "tests",
    ROOT / "packages" / "vllm-marconi-offload" / "tests",
    ROOT / "packages" / "vllm-kv-astpatch" / "tests",
    ROOT / "packages" / "vllm-kv-identity" / "tests",
    ROOT / "tests-integration",
    ROOT / "tests",
]


def test_no_two_test_files_of_the_integration_run_share_a_name() -> None:
    places: defaultdict[str, list[str]] = defaultdict(list)
    for folder in COLLECTED_TOGETHER:
        for path in folder.glob("test_*.py"):
            places[path.name].append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in places.items() if len(where) > 1} == {}
