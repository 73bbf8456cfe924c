"""Per-item results of batch operations."""

from __future__ import annotations

import enum
from typing import NamedTuple

from .protocol import Status, status_name

__all__ = ["ItemResult", "ResultKind", "result_from_status"]


class ResultKind(enum.StrEnum):
    """What happened to one item of a batch."""

    OK = "ok"  #: stored (put) / fully read (get)
    MISS = "miss"  #: get: absent, evicted, or stored with a different length
    TRANSPORT = "transport"  #: the connection failed; the item's fate is unknown
    SERVER = "server"  #: the server refused the item (no space, too large, ...)


class ItemResult(NamedTuple):
    """``(kind, cause)`` for one item; truthy only when ``kind`` is OK."""

    kind: ResultKind
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.kind is ResultKind.OK

    def __bool__(self) -> bool:
        return self.kind is ResultKind.OK


OK = ItemResult(ResultKind.OK)
MISS = ItemResult(ResultKind.MISS, "not found")


def result_from_status(code: int, stored_len: int = 0) -> ItemResult:
    """Map a per-item wire status to an :class:`ItemResult`."""
    if code == Status.OK:
        return OK
    if code == Status.NOT_FOUND:
        return MISS
    if code == Status.SIZE_MISMATCH:
        return ItemResult(ResultKind.MISS, f"stored value has {stored_len} bytes")
    hint = _HINTS.get(code)
    return ItemResult(
        ResultKind.SERVER, f"{status_name(code)}: {hint}" if hint else status_name(code)
    )


_HINTS: dict[int, str] = {
    Status.VALUE_TOO_LARGE: "value exceeds the server's per-value limit (memory / lanes)",
    Status.NO_SPACE: "server could not free memory in time (values pinned by readers)",
    Status.TRANSFER_FAILED: "RDMA transfer failed",
    Status.UNSUPPORTED: "the server does not implement this operation (upgrade it)",
}
