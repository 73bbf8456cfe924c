# Sourced by the GPU scripts that start memkv-vllm without installing it: memkv-vllm registers
# its tier type through a vllm.general_plugins entry point, which a dist-info in /tmp/memkv-ep
# provides once that folder is on PYTHONPATH (this file puts it there).
memkv_ep=/tmp/memkv-ep
mkdir -p "$memkv_ep/memkv_vllm-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: memkv-vllm\nVersion: 0.1.0\n' > "$memkv_ep/memkv_vllm-0.1.0.dist-info/METADATA"
printf '[vllm.general_plugins]\nmemkv_tier = memkv_vllm:register\n' > "$memkv_ep/memkv_vllm-0.1.0.dist-info/entry_points.txt"
export PYTHONPATH=$memkv_ep${PYTHONPATH:+:$PYTHONPATH}
