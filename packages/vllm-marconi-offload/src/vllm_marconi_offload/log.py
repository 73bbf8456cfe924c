"""The connector's logger.

It sits under vLLM's `vllm` logger so that its lines use vLLM's handler, format and
`VLLM_LOGGING_LEVEL`; a logger outside that tree would print nothing below WARNING.
"""

import logging

logger = logging.getLogger("vllm.ext.marconi_offload")
