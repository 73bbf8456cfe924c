#!/usr/bin/env bash
# On the GPU host, after install.sh: engine start-up with a CPU tier of STARTUP_GIB GiB
# (default 32), STARTUP_REPEATS times per mode (default 3), alternating native and ours, after
# throw-away starts of both (4 GiB) that fill the torch.compile cache and ours' Triton
# kernel cache; the first start of each mode also measures TTFT
# of a STARTUP_LENGTH-token prompt (default 32768; 0: none) from HBM and from the CPU tier.
# STARTUP_WARM=0 skips the throw-away starts (a host that has run them already).
# STARTUP_MODES: the modes alternated (default "native ours"); `ours:LOAD_MODE` runs ours with
# that `load_mode` (GPU_BENCH_LOAD_MODE), `lmcache` needs LMCache (lmcache_env.sh).
# STARTUP_CPU_EVICT (fill | reset) picks how the prompt leaves HBM (startup_bench.py).
# PROGRAMS_TRY=N: ours' second start also measures TTFT with
# VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM=N.
# Usage: bash run_startup.sh   (from this folder; $OUT/startup.tgz holds the JSON files)
cd "$(dirname "$0")"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
source ./lmcache_env.sh
out=${OUT:-/tmp}
gib=${STARTUP_GIB:-32}
length=${STARTUP_LENGTH:-32768}
bench() {  # TAG LIMIT_S MODE[:LOAD_MODE] GIB [LENGTH]
  local mode=${3%%:*} load=${3#*:} tag=$1
  [ "$load" = "$3" ] && load= || tag=$1-$load
  echo "=== startup $3 $4 GiB ($1) $(date -u +%T)"
  GPU_BENCH_LOAD_MODE=$load STARTUP_TAG=$tag timeout "$2" python3 startup_bench.py "$mode" "${@:4}" \
    2>&1 | tee -a "$out/startup.log" | grep -E "^startup |RESULT|load_mode|Error|Traceback" | cut -c1-900
}
if [ "${STARTUP_WARM:-1}" != 0 ]; then
  bench warm 300 native 4
  bench warm 150 ours 4
fi
for i in $(seq "${STARTUP_REPEATS:-3}"); do
  for mode in ${STARTUP_MODES:-native ours}; do
    if [ "$i" = 1 ] && [ "$length" != 0 ]; then
      bench "$i" 200 "$mode" "$gib" "$length"
    elif [ "$i$mode" = 2ours ] && [ -n "${PROGRAMS_TRY:-}" ]; then
      VLLM_MARCONI_OFFLOAD_PCIE_PROGRAMS_PER_SM=$PROGRAMS_TRY bench "$i-p$PROGRAMS_TRY" 200 ours "$gib" "$length"
    else
      bench "$i" 120 "$mode" "$gib"
    fi
  done
done
lmcache_fallback "$out/startup.log"
(cd "$out" && tar czf startup.tgz startup-*.json && rm -f startup-*.json && gzip -f startup.log)
