"""Assert that our distributions are installed as released, not from this source tree.

    python -I tools/check_install.py ROOT NAME==VERSION [NAME==VERSION ...]

Run with `python -I` (no script folder, PYTHONPATH or user site on sys.path) from a folder
outside ROOT. For each named distribution: the installed version is exactly VERSION and
it is no editable install; its import package loads from outside ROOT; every entry point
it declares (console scripts, vLLM plugins) loads; every console script answers
`--version` with VERSION, except those named in VERSIONLESS (helper-owned, see below).
Exit status 1 lists every failure.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# Console scripts not checked for `--version`: memkv's flag belongs to memkv-client's own
# CLI work (issue 14); remove it from here once `memkv --version` exists.
VERSIONLESS = frozenset({"memkv"})


def _inside(path: Path, root: Path) -> bool:
    """Whether `path` is the checkout `root` itself or in its packages' sources."""
    path = path.resolve()
    return path == root or path.is_relative_to(root / "packages")


def check_distribution(name: str, version: str, root: Path) -> list[str]:
    """Every way the installed `name` is not release `version` of ours."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return [f"{name}: not installed"]
    problems: list[str] = []
    if dist.version != version:
        problems.append(f"{name}: installed {dist.version}, expected {version}")
    direct_url = dist.read_text("direct_url.json")
    if direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"):
        problems.append(f"{name}: an editable install")
    module_name = name.replace("-", "_")  # every package's import name
    module = importlib.import_module(module_name)
    location = Path(module.__file__ or "")
    if _inside(location, root):
        problems.append(f"{name}: `import {module_name}` loaded {location}, in the source tree")
    for entry_point in dist.entry_points:
        try:
            entry_point.load()
        except Exception as exc:
            problems.append(
                f"{name}: entry point {entry_point.name} ({entry_point.value}): {exc!r}"
            )
            continue
        if entry_point.group == "console_scripts" and entry_point.name not in VERSIONLESS:
            problems += _check_version_flag(name, entry_point.name, version)
    return problems


def _check_version_flag(name: str, script: str, version: str) -> list[str]:
    executable = Path(sys.executable).parent / script
    result = subprocess.run(
        [str(executable), "--version"], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0 or version not in result.stdout:
        return [f"{name}: `{script} --version` printed {result.stdout!r} (rc {result.returncode})"]
    return []


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    problems = [
        f"sys.path holds {p}, in the source tree" for p in sys.path if p and _inside(Path(p), root)
    ]
    checked = []
    for spec in argv[1:]:
        name, _, version = spec.partition("==")
        problems += check_distribution(name, version, root)
        checked.append(spec)
    for problem in problems:
        print(f"check_install: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_install: ok: {', '.join(checked)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
