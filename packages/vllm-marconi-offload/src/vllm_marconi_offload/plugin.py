"""`vllm.general_plugins` entry point: makes `"kv_connector": "MarconiOffloadConnector"`
work without `kv_connector_module_path`. vLLM runs it in every process, possibly twice."""

from __future__ import annotations

from .log import logger

CONNECTOR_NAME = "MarconiOffloadConnector"


def register() -> None:
    """Register the connector with vLLM's `KVConnectorFactory` (idempotent)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.register_connector(
            CONNECTOR_NAME, "vllm_marconi_offload.connector", CONNECTOR_NAME
        )
    except ValueError:
        return  # already registered in this process
    logger.debug("registered %s with KVConnectorFactory", CONNECTOR_NAME)
