#!/usr/bin/env bash
# On the GPU host, after install.sh: TTFT for every mode, each in its own process.
# Usage: bash run_ttft.sh [LENGTHS] [MODES]   (from this folder; results and log under $OUT)
cd "$(dirname "$0")"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
lengths=${1:-4096,16384,32768}
# Production mode compiles and captures CUDA graphs at start (~1 min on a fresh host).
declare -A limit=([ours]=300 [plain]=200 [native]=240)
for mode in ${2:-ours plain native}; do
  echo "=== ttft $mode $(date -u +%T)"
  timeout "${limit[$mode]:-200}" python3 ttft_bench.py "$mode" "$lengths" 2>&1 | tee -a "${OUT:-/tmp}/ttft.log" \
    | grep -E "^[0-9]+ \{|RESULT|Error|error|CPU-OFFLOAD HIT|Traceback" | cut -c1-600
done
