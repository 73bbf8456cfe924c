"""The direct mode's `LoadStoreSpec`: built by the scheduler side, read by the workers."""

from __future__ import annotations

from . import _compat as c

__all__ = ["MemKVLoadStoreSpec"]


class MemKVLoadStoreSpec(c.LoadStoreSpec):  # type: ignore[misc]
    """The OffloadKeys of a transfer, in the order of the GPU blocks they pair with."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys

    def __repr__(self) -> str:
        return f"MemKVLoadStoreSpec({len(self.keys)} keys)"
