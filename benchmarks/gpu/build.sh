#!/usr/bin/env bash
# Build the kit that installs vLLM 0.26.0 on the H200 host (torch 2.11 + CUDA 13 image, no
# registry). Run on the development machine from the repository root (~3-10 min):
#   bash benchmarks/gpu/build.sh        -> .gpukit/p1/part.aa, .gpukit/p2/part.ab
# Each part is < 60 MiB, so one part plus the working tree fits one device run.
# KIT_PARTS=3 cuts it in three (~40 MiB each, .gpukit/p1-p3), leaving room beside a part.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
here="$repo/benchmarks/gpu"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cd "$work"
python3 -m pip download -q --no-deps -d . vllm==0.26.0
mkdir x && (cd x && unzip -q ../vllm-0.26.0-*.whl)
# Not needed on a Hopper GPU running FlashAttention-3: FA2 kernels, MoE/MLA/FP4 extensions,
# vendored CUDA headers, the Rust router.
rm -f x/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so x/vllm/_moe_C_stable_libtorch.abi3.so \
      x/vllm/_flashmla_C.abi3.so x/vllm/_flashmla_extension_C.abi3.so x/vllm/_qutlass_C.abi3.so \
      x/vllm/vllm-rs
rm -rf x/vllm/third_party/deep_gemm x/vllm/third_party/fmha_sm100
(cd x && tar cf - vllm vllm-0.26.0.dist-info | xz -T0 -6 > ../vllm.tar.xz)
# Pure-Python and small native dependencies the GPU image lacks (gpu_image_packages.txt):
# vLLM's, then our packages' own (bitmath: kvpool-mmap's sizes; without it no engine starts).
cp "$here/deps_closure.py" . && cp "$here/gpu_image_packages.txt" dev_pkgs.txt && mkdir deps
python3 deps_closure.py cachetools blake3 "fastapi[standard]<0.137.0,>=0.133.0" "starlette>=1.0.1" \
  "openai>=2.0.0" "pydantic>=2.12.0" "prometheus-fastapi-instrumentator>=8.0.0" \
  "lm-format-enforcer==0.11.3" "llguidance<1.8.0,>=1.7.0" "outlines_core==0.2.14" "lark==1.2.2" \
  "xgrammar<1.0.0,>=0.2.1" partial-json-parser "jsonschema>=4.23.0" "pyzmq>=25.0.0" msgspec \
  "mistral_common[image]>=1.11.5" pycountry "compressed-tensors==0.17.0" "depyf==0.20.0" \
  watchfiles python-json-logger pybase64 cbor2 ijson setproctitle "openai-harmony>=0.0.3" \
  "anthropic>=0.71.0" "model-hosting-container-standards<1.0.0,>=0.1.14" mcp \
  "opentelemetry-sdk>=1.27.0" "opentelemetry-api>=1.27.0" "opentelemetry-exporter-otlp>=1.27.0" \
  "opentelemetry-semantic-conventions-ai>=0.4.1" "nvtx==0.2.15" "apache-tvm-ffi>=0.1.11" \
  "bitmath>=2.1"
tar cf kit.tar vllm.tar.xz deps
parts=${KIT_PARTS:-2}
rm -rf "$repo"/.gpukit/p[0-9]
split -n "$parts" -a 2 kit.tar part.
i=1
for part in part.*; do
  mkdir -p "$repo/.gpukit/p$i" && mv "$part" "$repo/.gpukit/p$i/$part"
  i=$((i + 1))
done
ls -la "$repo"/.gpukit/*
