# Sourced by the run_*.sh scripts: puts LMCache (installed into $LMC_TARGET, default /tmp/lmc,
# by lmcache_build.sh or from a wheel) on PYTHONPATH where it is there, and defines
# `lmcache_fallback FILE...`, which prints the logs in which LMCache ran without its compiled
# CUDA ops (its pure-torch fallback: not a valid LMCache run).
lmc=${LMC_TARGET:-/tmp/lmc}
[ -d "$lmc" ] && export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$lmc
lmcache_fallback() {
  zgrep -l "compiled extension not found" "$@" 2>/dev/null | sed "s/^/INVALID (LMCache fallback): /"
}
