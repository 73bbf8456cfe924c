"""`MemKVOffloadingConnector`: vLLM's `OffloadingConnector` that recomputes failed loads.

Select it with `"kv_connector": "MemKVOffloadingConnector", "kv_connector_module_path":
"memkv_vllm.connector", "kv_load_failure_policy": "recompute"` and the direct spec in
`kv_connector_extra_config`. It is `OffloadingConnector` unchanged, plus the one hook
vLLM offers for connectors whose loads can fail, `get_block_ids_with_load_errors`: a
value that vanished from MemKV between lookup and load (evicted, server restarted) is
recomputed by vLLM instead of stopping the engine (see `.load_errors`). With any
other spec it behaves exactly like `OffloadingConnector`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import _compat as c
from .load_errors import LoadErrors, attached

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.outputs import KVConnectorOutput

__all__ = ["MemKVOffloadingConnector"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers


class MemKVOffloadingConnector(c.offloading_connector_cls()):  # type: ignore[misc]
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, *args: Any, **kwargs: Any
    ) -> None:
        self._memkv_load_errors = LoadErrors()
        with attached(self._memkv_load_errors):  # the spec's manager is built in here
            super().__init__(vllm_config, role, *args, **kwargs)
        policy = c.load_failure_policy(vllm_config)
        if role.name == "SCHEDULER" and policy != "recompute":
            log.warning(
                "memkv-vllm: kv_load_failure_policy=%r: a block that vanishes from MemKV "
                'between lookup and load fails its request; set "kv_load_failure_policy": '
                '"recompute" in --kv-transfer-config to recompute it instead',
                policy,
            )

    # --- worker side: the spec's worker is built while KV caches are registered ---------

    def register_kv_caches(self, *args: Any, **kwargs: Any) -> Any:
        with attached(self._memkv_load_errors):
            return super().register_kv_caches(*args, **kwargs)

    def register_cross_layers_kv_cache(self, *args: Any, **kwargs: Any) -> Any:  # <= 0.28
        with attached(self._memkv_load_errors):
            return super().register_cross_layers_kv_cache(*args, **kwargs)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._memkv_load_errors.take_blocks()

    # --- scheduler side -----------------------------------------------------------------

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if c.invalid_block_ids(connector_output):
            self._memkv_load_errors.scheduler_saw_failure()
        super().update_connector_output(connector_output)
