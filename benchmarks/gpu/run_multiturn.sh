#!/usr/bin/env bash
# On the GPU host, after install.sh: the multi-turn benchmark for each mode, one process each.
# Usage: bash run_multiturn.sh [MODES]   (from this folder; results and logs under $OUT)
# PYSPY=/path/to/py-spy also records the engine core's stacks for the whole run
# ($OUT/py-spy-MODE.txt.gz, raw collapsed stacks; summarize with summarize_profile.py).
# STEPS=1 records every scheduler step ($OUT/steps-MODE.jsonl.gz) and prints its report per round
# (step_timeline.py), then every warm-round step slower than STALL_MS (default 100) with the
# stacks its threads spent it in (in $OUT/steps-MODE.txt; the first STALL_PRINT_BYTES printed).
cd "$(dirname "$0")"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
source ./lmcache_env.sh
out=${OUT:-/tmp}
for mode in ${1:-ours plain}; do
  echo "=== multiturn $mode $(date -u +%T)"
  log="$out/multiturn-$mode.log"
  steps="$out/steps-$mode.jsonl"
  rm -f "$steps"
  [ "${STEPS:-}" = 1 ] && export STEP_TIMELINE="$steps"
  timeout "${MULTITURN_LIMIT_S:-280}" python3 multiturn_bench.py "$mode" > "$log" 2>&1 &
  bench=$!
  if [ -n "${PYSPY:-}" ]; then
    (
      for _ in $(seq 180); do
        core=$(pgrep -f "VLLM::EngineCore" | head -1)
        [ -n "$core" ] && break
        sleep 1
      done
      [ -n "$core" ] && "$PYSPY" record -s --idle -r 67 --nonblocking -f raw \
        -o "$out/py-spy-$mode.txt" --pid "$core" > /dev/null 2>&1
      gzip -f "$out/py-spy-$mode.txt" 2> /dev/null
    ) &
  fi
  wait "$bench"
  wait
  grep -E "^\{|RESULT|Error|error|Traceback" "$log" | cut -c1-600
  if [ -s "$steps" ] && [ -s "$out/multiturn-$mode.json" ]; then
    python3 step_timeline.py "$steps" "$out/multiturn-$mode.json" | tee "$out/steps-$mode.txt"
    python3 step_timeline.py --stalls "${STALL_MS:-100}" "$steps" "$out/multiturn-$mode.json" \
      >> "$out/steps-$mode.txt"
    head -c "${STALL_PRINT_BYTES:-3000}" <(grep -A4 "^round" "$out/steps-$mode.txt")
  fi
  [ -f "$steps" ] && gzip -f "$steps"
  lmcache_fallback "$log"
  gzip -f "$log"
done
