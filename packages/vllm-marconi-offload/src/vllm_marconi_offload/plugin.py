"""`vllm.general_plugins` entry point: makes `"kv_connector": "MarconiOffloadConnector"`
work without `kv_connector_module_path`. vLLM runs it in every process, possibly twice."""

from __future__ import annotations

from . import early_check
from .early_check import CONNECTOR_NAME
from .log import logger


def register() -> None:
    """Register the connector with vLLM's `KVConnectorFactory` and check its config as
    soon as vLLM has built it (idempotent)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    early_check.install()
    try:
        KVConnectorFactory.register_connector(
            CONNECTOR_NAME, "vllm_marconi_offload.connector", CONNECTOR_NAME
        )
    except ValueError:
        return  # already registered in this process
    logger.debug("registered %s with KVConnectorFactory", CONNECTOR_NAME)
