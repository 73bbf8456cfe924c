"""Synthetic fixture modules: source written to a temporary folder, then imported."""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_counter = itertools.count()

MakeModule = Callable[[str], types.ModuleType]


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeModule]:
    """Write `source` to a fresh module file, import it and return the module."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created: list[str] = []

    def make(source: str) -> types.ModuleType:
        name = f"astpatch_fixture_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        created.append(name)
        return importlib.import_module(name)

    yield make
    for name in created:
        sys.modules.pop(name, None)


# A scheduler shaped like vLLM 0.22.1's: the assert in the split, and a schedule()
# whose waiting-request branch calls the split even for an asynchronous load.
SCHEDULER_0_22 = """
class Scheduler:
    need_mamba_block_aligned_split = True

    def _mamba_block_aligned_split(
        self,
        request,
        num_new_tokens,
        num_new_local_computed_tokens=0,
        num_external_computed_tokens=0,
    ):
        assert num_external_computed_tokens == 0, (
            "External KV connector is not verified yet"
        )
        num_computed_tokens = (
            request + num_new_local_computed_tokens + num_external_computed_tokens
        )
        if num_computed_tokens < 100:
            num_new_tokens = num_new_tokens // 16 * 16
        return num_new_tokens

    def schedule(self, ext_tokens, is_async):
        num_external_computed_tokens = ext_tokens
        load_kv_async = is_async
        if load_kv_async:
            num_new_tokens = 0
        else:
            num_new_tokens = 40
        if self.need_mamba_block_aligned_split:
            num_new_tokens = self._mamba_block_aligned_split(
                0,
                num_new_tokens,
                0,
                num_external_computed_tokens,
            )
            if num_new_tokens == 0:
                return "stuck"
        return ("load" if load_kv_async else "run", num_new_tokens)
"""

# The same after upstream's fix (vLLM 0.23.0 and later).
SCHEDULER_0_23 = SCHEDULER_0_22.replace(
    """        assert num_external_computed_tokens == 0, (
            "External KV connector is not verified yet"
        )
""",
    "",
).replace(
    "        if self.need_mamba_block_aligned_split:\n            num_new_tokens = self._mamba_block_aligned_split(\n                0,",
    "        if self.need_mamba_block_aligned_split and not load_kv_async:\n"
    "            num_new_tokens = self._mamba_block_aligned_split(\n                0,",
)
assert "assert" not in SCHEDULER_0_23
assert "not load_kv_async" in SCHEDULER_0_23
