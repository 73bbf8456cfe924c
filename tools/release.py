"""Release consistency of the eight packages: one version, exact pins, licence, py.typed.

All packages are released together under one version. Each package's version lives in
one place, `src/<import_name>/_version.py` (hatch reads it); the exact `==` pins between
our own packages in the pyproject.toml files must name that same version.

    python tools/release.py check          # exit 1, listing every problem
    python tools/release.py bump 2.1.0     # rewrite every _version.py and internal pin
    python tools/release.py constraints    # `name==version` for each package (stdout)
    python tools/release.py check-dist dist  # each wheel + sdist built, with LICENSE, py.typed
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PACKAGES_DIR = ROOT / "packages"
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def packages() -> dict[str, Path]:
    """Canonical distribution name -> package folder."""
    found: dict[str, Path] = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        found[canonicalize_name(_project(pyproject.parent)["name"])] = pyproject.parent
    return found


def _project(folder: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    return project


def version_file(folder: Path) -> Path:
    """The file hatch reads the package's version from."""
    data = tomllib.loads((folder / "pyproject.toml").read_text())
    return folder / str(data["tool"]["hatch"]["version"]["path"])


def read_version(folder: Path) -> str:
    match = VERSION_LINE.search(version_file(folder).read_text())
    if match is None:
        raise ValueError(f'{version_file(folder)}: no `__version__ = "..."` line')
    return match.group(1)


def check() -> list[str]:
    """Every way the release is inconsistent; empty when it is ready to build."""
    found = packages()
    versions = {name: read_version(folder) for name, folder in found.items()}
    problems: list[str] = []
    if len(set(versions.values())) > 1:
        problems.append(f"packages disagree on the release version: {versions}")
    for name, folder in found.items():
        project = _project(folder)
        for spec in project.get("dependencies", []):
            req = Requirement(spec)
            dep = canonicalize_name(req.name)
            if dep in found and str(req.specifier) != f"=={versions[dep]}":
                problems.append(
                    f"{name}: dependency {spec!r} must pin {dep}=={versions[dep]} exactly"
                )
        if not filecmp.cmp(folder / "LICENSE", ROOT / "LICENSE", shallow=False):
            problems.append(f"{name}: LICENSE differs from the repository's LICENSE")
        if not (version_file(folder).parent / "py.typed").exists():
            problems.append(f"{name}: no py.typed beside {version_file(folder).name}")
        for key in ("license", "license-files", "classifiers", "requires-python"):
            if key not in project:
                problems.append(f"{name}: pyproject.toml [project] has no {key!r}")
    return problems


def check_dist(dist: Path) -> list[str]:
    """Every package's wheel and sdist of this release in `dist`, each carrying LICENSE."""
    problems: list[str] = []
    for name, folder in packages().items():
        stem = f"{name.replace('-', '_')}-{read_version(folder)}"
        wheel, sdist = dist / f"{stem}-py3-none-any.whl", dist / f"{stem}.tar.gz"
        if not wheel.exists() or not sdist.exists():
            problems.append(f"{name}: {wheel.name} or {sdist.name} missing from {dist}")
            continue
        members = set(zipfile.ZipFile(wheel).namelist())
        module = version_file(folder).parent.name
        for member in (f"{stem}.dist-info/licenses/LICENSE", f"{module}/py.typed"):
            if member not in members:
                problems.append(f"{name}: {wheel.name} lacks {member}")
        with tarfile.open(sdist) as archive:
            if f"{stem}/LICENSE" not in archive.getnames():
                problems.append(f"{name}: {sdist.name} lacks {stem}/LICENSE")
    return problems


def bump(new: str) -> None:
    """Set every package's version to `new` and re-pin the internal dependencies."""
    Version(new)  # raises InvalidVersion for a malformed version
    found = packages()
    for folder in found.values():
        path = version_file(folder)
        path.write_text(VERSION_LINE.sub(f'__version__ = "{new}"', path.read_text()))
    names = "|".join(re.escape(name) for name in found)
    pin = re.compile(rf'^(\s*"(?:{names}))==[^"]+(",?)$', re.MULTILINE)
    for folder in found.values():
        pyproject = folder / "pyproject.toml"
        pyproject.write_text(pin.sub(rf"\g<1>=={new}\g<2>", pyproject.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="list release inconsistencies; exit 1 if any")
    bump_parser = sub.add_parser("bump", help="set every package to VERSION")
    bump_parser.add_argument("version", metavar="VERSION")
    sub.add_parser("constraints", help="print name==version for every package")
    dist_parser = sub.add_parser("check-dist", help="check the built wheels and sdists")
    dist_parser.add_argument("dist", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "bump":
        bump(args.version)
    elif args.command == "constraints":
        for name, folder in packages().items():
            print(f"{name}=={read_version(folder)}")
        return 0
    problems = check_dist(args.dist) if args.command == "check-dist" else check()
    for problem in problems:
        print(f"release.py: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
