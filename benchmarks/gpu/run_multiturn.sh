#!/usr/bin/env bash
# On the GPU host, after install.sh: the multi-turn benchmark for each mode, one process each.
# Usage: bash run_multiturn.sh [MODES]   (from this folder; results and log under $OUT)
cd "$(dirname "$0")"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for mode in ${1:-ours plain}; do
  echo "=== multiturn $mode $(date -u +%T)"
  timeout ${MULTITURN_LIMIT_S:-280} python3 multiturn_bench.py "$mode" 2>&1 | tee -a "${OUT:-/tmp}/multiturn.log" \
    | grep -E "^\{|RESULT|Error|error|Traceback" | cut -c1-600
done
