#!/usr/bin/env bash
# On a CUDA host with vLLM importable from /tmp/site (benchmarks/gpu/install.sh): register
# memkv-vllm's entry point through a dist-info, then run memkv_gpu_check.py. Usage, from the
# repo root: bash benchmarks/gpu/run_memkv_gpu_check.sh OUTDIR
set -euo pipefail
out=${1:?usage: run_memkv_gpu_check.sh OUTDIR}
repo=$(pwd)
export PYTHONPATH=; source benchmarks/gpu/memkv_entry_point.sh
export PYTHONPATH=/tmp/site:$PYTHONPATH:$repo/packages/memkv-client/src:$repo/packages/memkv-vllm/src
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
work=/tmp/memkv-gpu-check; rm -rf "$work"
rc=0; python3 benchmarks/gpu/memkv_gpu_check.py "$work" 2>&1 | tail -40 || rc=$?
cp "$work/gpu_check.json" "$out/" || true
for f in "$work"/engine*/engine.log; do n=$(basename "$(dirname "$f")"); tail -c 300000 "$f" > "$out/$n.log"; done 2>/dev/null || true
exit $rc
