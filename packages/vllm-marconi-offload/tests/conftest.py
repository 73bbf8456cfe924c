"""The repository's tools/ on the import path; the `mount` fixture (real small filesystems)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

from host_fixtures import mount  # noqa: F401  (a fixture)
