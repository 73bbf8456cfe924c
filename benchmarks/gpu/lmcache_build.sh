#!/usr/bin/env bash
# On the GPU host: build LMCache 0.5.6 from its sdist against the image's torch, with its CUDA
# extension (lmcache.cuda_ops, sm_90) and its C++ extensions (lmcache_native, lmcache_fs,
# lmcache_redis), install it into $LMC_TARGET (/tmp/lmc), and stop unless the compiled ops load.
# The published wheel is built for torch 2.13 and runs on its pure-torch fallback under the
# image's torch 2.11 (docs/benchmarks/history/gpu-2026-12-06-h100.md).
#
# DIR holds what the host cannot download (made on the development machine, see
# .work/gpu-lmcache-plan.md): lmcache-0.5.6-trimmed.tar.gz (the sdist without docs, tests,
# examples, operator, asset, benchmarks) and the wheels of setuptools<81, setuptools_scm<10,
# grpcio and grpcio-tools 1.78.0, protobuf 6 (build only, /tmp/lmcb) and aiofile, caio
# (runtime, beside LMCache). Log: $OUT/lmcache-build.log. Takes ~3-6 min with 16 cores.
# Usage: bash benchmarks/gpu/lmcache_build.sh DIR     then: PYTHONPATH=/tmp/site:/tmp/lmc
#        bash benchmarks/gpu/lmcache_build.sh --check  (again, once the vLLM kit is in /tmp/site)
set -euo pipefail
src=${1:?usage: lmcache_build.sh DIR | --check}
out=${OUT:-/tmp/lmc-out}
target=${LMC_TARGET:-/tmp/lmc}
py=${PYTHON:-python3}
log=$out/lmcache-build.log
mkdir -p "$out"

fail() { echo "lmcache_build: $*; LMCache would run on its pure-torch fallback, stopping" >&2; exit 2; }
pip_offline() { "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$@"; }

# Proof. Without the vLLM kit in /tmp/site, `import lmcache` lacks cachetools, dill and
# opentelemetry, so the compiled modules are loaded by file: that shows they link and initialise
# against this torch. With the kit, lmcache.device_ops must bind every public op of cuda_ops
# (no torch baseline left) and vLLM's LMCache connector must import.
check() {
  if [ ! -f /tmp/site/.kit-installed ]; then
    PYTHONPATH=$target "$py" - <<'EOF' 2>&1 | tee -a "$log" || fail "a compiled module does not load (above)"
import glob, importlib.util, os, sys, torch
target = os.environ["PYTHONPATH"]
for name in ("cuda_ops", "lmcache_native"):
    files = glob.glob(f"{target}/lmcache/{name}.*.so")
    assert files, f"{target}/lmcache/{name}.*.so missing"
    spec = importlib.util.spec_from_file_location(name, files[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(f"{name} loads against torch {torch.__version__}: {files[0]}")
EOF
    echo "vLLM kit not installed: bind check and adapter import skipped; after the kit run:" \
      "bash benchmarks/gpu/lmcache_build.sh --check" | tee -a "$log"
    return
  fi
  PYTHONPATH=/tmp/site:$target "$py" - <<'EOF' 2>&1 | tee -a "$log" || fail "the compiled ops are not in use (above)"
import torch
import lmcache
import lmcache.cuda_ops as cuda_ops
import lmcache.lmcache_native as native
import lmcache.integration.vllm.vllm_v1_adapter as adapter
import vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector  # noqa: F401

print("lmcache", lmcache.__version__, lmcache.__file__)
print("cuda_ops", cuda_ops.__file__)
print("lmcache_native", native.__file__)
print("vLLM adapter imports:", adapter.__file__)
ops = lmcache.device_ops
ops.ensure_native()
public = [n for n in dir(cuda_ops) if not n.startswith("_") and callable(getattr(cuda_ops, n))]
unbound = [n for n in public if getattr(ops, n, None) is not getattr(cuda_ops, n)]
assert public and not unbound, f"{type(ops).__name__} did not bind cuda_ops: {unbound or 'no ops'}"
print(f"{type(ops).__name__} runs {len(public)} compiled ops; GPU: {torch.cuda.get_device_name()}")
EOF
  echo "lmcache_build: OK; run LMCache with PYTHONPATH=/tmp/site:$target" | tee -a "$log"
}

if [ "$src" = --check ]; then check; exit; fi
src=$(realpath "$src")

# The toolchain the CUDA extension needs, checked before anything is built.
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || fail "nvcc not found (PATH, /usr/local/cuda/bin)"
"$py" - <<'EOF' || fail "no CUDA torch or no Python headers in $py"
import os, sysconfig, torch
assert torch.version.cuda, f"torch {torch.__version__} is not a CUDA build"
header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
assert os.path.exists(header), f"{header} missing"
EOF
abi=$("$py" -c "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
{ nvcc --version | tail -2
  "$py" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cxx11_abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
  "$py" -m pip list 2>/dev/null | grep -i -E '^(setuptools|packaging|wheel|ninja|grpcio|protobuf|pybind11) ' || true
} | tee "$log"

start=$(date +%s)
rm -rf /tmp/lmcb /tmp/lmcsrc /tmp/lmcwhl && mkdir -p /tmp/lmcsrc "$target"
pip_offline --target /tmp/lmcb "$src"/setuptools-*.whl "$src"/setuptools_scm-*.whl \
  "$src"/grpcio-*.whl "$src"/grpcio_tools-*.whl "$src"/protobuf-*.whl
pip_offline --target "$target" "$src"/aiofile-*.whl "$src"/caio-*.whl
tar xzf "$src"/lmcache-0.5.6-trimmed.tar.gz -C /tmp/lmcsrc

echo "building LMCache 0.5.6 (TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS=16), log: $log"
(cd /tmp/lmcsrc/lmcache-0.5.6 &&
  env PYTHONPATH=/tmp/lmcb BUILD_WITH_CUDA=1 LMCACHE_CUDA_MAJOR=13 TORCH_CUDA_ARCH_LIST=9.0 \
    MAX_JOBS=${MAX_JOBS:-16} NVCC_THREADS=1 ENABLE_CXX11_ABI="$abi" \
    "$py" -m pip wheel -v --no-index --no-deps --no-build-isolation -w /tmp/lmcwhl . >> "$log" 2>&1) ||
  { tail -40 "$log"; fail "the build failed (tail above)"; }
pip_offline --target "$target" /tmp/lmcwhl/lmcache-*.whl
echo "built and installed into $target in $(( $(date +%s) - start )) s" | tee -a "$log"

check
