#!/usr/bin/env bash
# Export the committed packages/ and benchmarks/ to .gpukit/snap (carried to the GPU host),
# so device runs measure HEAD and not whatever is being edited in the working tree.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$repo/.gpukit/snap" && mkdir -p "$repo/.gpukit/snap"
git -C "$repo" archive HEAD packages benchmarks | tar -x -C "$repo/.gpukit/snap"
git -C "$repo" rev-parse HEAD > "$repo/.gpukit/snap/COMMIT"
echo "snapshot of $(cat "$repo/.gpukit/snap/COMMIT")"
