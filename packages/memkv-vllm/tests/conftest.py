"""The repository's tools/ on the import path (a real `memkv serve`, a Mooncake Store
cluster), and after ours memkv-client's tests (their fake sysfs trees); the `memkv`
fixture. The real-engine suites of memkv-vllm live in tests-integration/
(docs/interfaces.md, *Layout*)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
sys.path.append(str(Path(__file__).resolve().parents[2] / "memkv-client" / "tests"))  # fake sysfs

from memkv_server import memkv  # noqa: F401  (a fixture)
