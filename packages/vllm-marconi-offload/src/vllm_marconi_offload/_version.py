__version__ = "2.0.0"

SUPPORTED_VLLM = ">=0.26.0,<0.34"
"""The vLLM releases this plugin supports, as a PEP 440 specifier set. The startup check,
the `vllm` extra, the README's compatibility table and the nox matrix follow it."""
