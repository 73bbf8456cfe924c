"""Real hosts for the doctors' tests: small filesystems mounted for one test, and an
installed vLLM distribution of a chosen version (its metadata only)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

Mount = Callable[..., Path]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    """mount(fstype, options="") -> a fresh directory with a real `fstype` filesystem
    mounted on it (e.g. `mount("tmpfs", "size=1m")`, `mount("ramfs")`), unmounted after
    the test. Skips the test without the right to mount (not root, or a container
    without CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    mounted: list[Path] = []

    def make(fstype: str, options: str = "") -> Path:
        target = tmp_path / f"{fstype}-{len(mounted)}"
        target.mkdir()
        cmd = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(target)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount {fstype}: {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield make
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], check=True)


def install_vllm_metadata(site: Path, version: str, dist: str = "vllm") -> Path:
    """Make `site` hold an installed `dist` of `version` providing the `vllm` package (its
    dist-info only, what the doctors read); put `site` first on the path to see it."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    return site
