"""A tiny third-party distribution, `tenant-policies` 1.0, that adds the eviction policy
`tenant-lru` through kv-eviction's entry-point group, built as a wheel and installed by pip
into a folder of its own. Shared with vllm-marconi-offload's tests."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

POLICY = "tenant-lru"
MODULE = """
from typing import Any

from kv_eviction import LRUPolicy


class TenantLRU(LRUPolicy):
    name = "tenant-lru"


def build(**options: Any) -> TenantLRU:
    if options:
        raise ValueError(f"eviction policy 'tenant-lru' takes no options; got {sorted(options)}")
    return TenantLRU()
"""
FILES = {
    "tenant_policies.py": MODULE,
    "tenant_policies-1.0.dist-info/METADATA": (
        "Metadata-Version: 2.1\nName: tenant-policies\nVersion: 1.0\nRequires-Dist: kv-eviction\n"
    ),
    "tenant_policies-1.0.dist-info/WHEEL": (
        "Wheel-Version: 1.0\nGenerator: kv-eviction-tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    ),
    "tenant_policies-1.0.dist-info/entry_points.txt": (
        f"[kv_eviction.policies]\n{POLICY} = tenant_policies:build\n"
    ),
}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def install_policy_distribution(tmp: Path) -> Path:
    """Build the wheel in `tmp`, `pip install --target` it; the folder to put on sys.path."""
    wheel = tmp / "tenant_policies-1.0-py3-none-any.whl"
    record = "tenant_policies-1.0.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as archive:
        lines = []
        for name, text in FILES.items():
            archive.writestr(name, text)
            lines.append(_record_line(name, text.encode()))
        archive.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--disable-pip-version-check", "--target", str(site), str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    return site
