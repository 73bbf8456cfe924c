"""RDMA transport (placeholder until the verbs engine lands)."""

from __future__ import annotations

from typing import Any

from .config import Config


def open_verbs_backend(config: Config) -> tuple[Any, str]:
    return None, "RDMA engine not implemented yet"


class RdmaEngine:
    def __init__(self, backend: Any, config: Config) -> None:
        raise NotImplementedError
