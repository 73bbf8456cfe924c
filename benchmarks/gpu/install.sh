#!/usr/bin/env bash
# On the GPU host: add the carried kit parts (from DIR) to /tmp/mkit; once NPARTS are there,
# install vLLM 0.26.0 and the missing dependencies into /tmp/site (kept while the host stays up).
# Usage: install.sh DIR NPARTS      then: export PYTHONPATH=/tmp/site
set -e
src=${1:?usage: install.sh DIR NPARTS}; n=${2:?usage: install.sh DIR NPARTS}
mkdir -p /tmp/mkit && cp "$src"/part.* /tmp/mkit/ 2>/dev/null || true
have=$(ls /tmp/mkit/part.* 2>/dev/null | wc -l)
echo "kit parts on host: $have of $n"
if [ "$have" -ge "$n" ] && [ ! -f /tmp/site/.kit-installed ]; then
  rm -rf /tmp/mkitx && mkdir -p /tmp/mkitx /tmp/site
  cat /tmp/mkit/part.* | tar xf - -C /tmp/mkitx
  tar xJf /tmp/mkitx/vllm.tar.xz -C /tmp/site
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/mkitx/deps/*.whl 2>&1 | grep -v WARNING || true
  touch /tmp/site/.kit-installed
  PYTHONPATH=/tmp/site python3 -c "import vllm, torch; print('installed vllm', vllm.__version__, 'torch', torch.__version__)"
fi
