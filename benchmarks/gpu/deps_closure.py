"""Download the wheels of the given requirements and their dependencies, transitively, for
the GPU host (CPython 3.12, manylinux x86-64), skipping what its image already has
(dev_pkgs.txt) and GPU-only extras. Writes deps/*.whl in the current directory.

Usage: python deps_closure.py REQUIREMENT...
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement

SKIP_NAMES = (
    "torch torchvision torchaudio torchcodec pynvvideocodec flashinfer-python tilelang "
    "nvidia-cudnn-frontend fastsafetensors nvidia-cutlass-dsl quack-kernels tokenspeed-mla "
    "humming-kernels triton"
)
PLATFORMS = (
    "manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 "
    "manylinux1_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_24_x86_64 "
    "manylinux_2_5_x86_64"
)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_environment() -> dict[str, str]:
    env = dict(default_environment())
    env.update(
        python_version="3.12",
        python_full_version="3.12.3",
        platform_machine="x86_64",
        sys_platform="linux",
        platform_system="Linux",
        implementation_name="cpython",
        extra="",
    )
    return env


def download(req: Requirement) -> str | None:
    """Fetch one wheel (no dependencies); its path, or None if pip found none."""
    platforms = [arg for p in PLATFORMS.split() for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", "deps"]
    done = subprocess.run([*cmd, req.name + str(req.specifier)], capture_output=True, text=True)
    name = norm(req.name)
    wheels = [w for w in glob.glob("deps/*.whl") if norm(os.path.basename(w).split("-")[0]) == name]
    if not wheels:
        print("FAILED", req, done.stderr.strip().splitlines()[-1:])
        return None
    return wheels[0]


def requirements_of(wheel: str, extras: set[str], env: dict[str, str]) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(f for f in archive.namelist() if f.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    found = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        wanted = req.marker is None or req.marker.evaluate(env)
        wanted = wanted or any(f'extra == "{x}"' in str(req.marker) for x in extras)
        if wanted:
            found.append(str(req).split(";")[0])
    return found


def main() -> None:
    with open("dev_pkgs.txt") as f:
        have_already = {norm(d) for d in f.read().split()}
    skip = have_already | {norm(x) for x in SKIP_NAMES.split()}
    env = target_environment()
    todo = sys.argv[1:]
    seen: dict[str, str | None] = {}
    while todo:
        req = Requirement(todo.pop(0))
        name = norm(req.name)
        if name in seen or name in skip:
            continue
        seen[name] = wheel = download(req)
        if wheel is not None:
            todo.extend(requirements_of(wheel, set(req.extras), env))
    print(sum(1 for w in seen.values() if w), "wheels")


if __name__ == "__main__":
    main()
