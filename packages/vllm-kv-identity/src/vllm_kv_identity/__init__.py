"""What makes KV stored by one vLLM process reusable by another, shared by both plugins.

* `weights_fingerprint`: which checkpoint computed the KV.
* `restart_hash_problem`: whether vLLM's block hashes will be the same in the next process.
* `unsupported_vllm`: whether a plugin's supported range holds the running vLLM.
* `block_key`, `chain_keys`, `key_group`: how a block hash and its KV-cache group pack into
  one store key (the packing of vLLM's own `OffloadKey`).
* `aligned_external_hit_tokens`, `mamba_alignment_tokens`: where an external hit may end
  on a model with Mamba layers.
* `vllm_kv_identity.vocabulary`: the `kv_transfer_params` keys, `offload_priority`
  values, tier media and localities, and the latency buckets both plugins use.

Standard library and `packaging` only: nothing here imports vLLM; callers pass in what
they read from it. The plugins' data paths also share `vllm_kv_identity.block_copy` (the
row format of a stored block and its copier), which imports torch and is not imported here.
Both plugins' `doctor` commands are built from `vllm_kv_identity.doctor` (the checklist and
its command line) and `vllm_kv_identity.host_checks` (vLLM's version, `PYTHONHASHSEED`, the
locked-memory limit, free space and O_DIRECT).
"""

from __future__ import annotations

from ._version import __version__
from .alignment import aligned_external_hit_tokens, mamba_alignment_tokens
from .hashseed import restart_hash_problem
from .keys import GROUP_ID_BYTES, block_key, chain_keys, key_group
from .supported import unsupported_vllm
from .weights import weights_fingerprint

__all__ = [
    "GROUP_ID_BYTES",
    "__version__",
    "aligned_external_hit_tokens",
    "block_key",
    "chain_keys",
    "key_group",
    "mamba_alignment_tokens",
    "restart_hash_problem",
    "unsupported_vllm",
    "weights_fingerprint",
]
