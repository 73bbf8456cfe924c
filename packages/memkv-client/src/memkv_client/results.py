"""Per-item results of batch operations."""

from __future__ import annotations

import enum

from .protocol import Status, status_name

__all__ = ["ItemResult", "ResultKind", "result_from_status"]


class ResultKind(enum.StrEnum):
    """What happened to one item of a batch."""

    OK = "ok"  #: stored (put) / fully read (get)
    MISS = "miss"  #: get: absent, evicted, or stored with a different length
    TRANSPORT = "transport"  #: the connection failed; the item's fate is unknown
    SERVER = "server"  #: the server refused the item (no space, too large, ...)


class ItemResult(int):
    """One item's outcome: an `int` that is 1 for OK and 0 otherwise, with the detail.

    The vendor's documented contract is a per-item hit flag: `result == True` holds
    exactly for a stored/read item (`bool` cannot be subclassed, so this is an
    `int` equal to `True` or `False`). `kind` and `cause` keep the detail.
    """

    kind: ResultKind
    cause: str

    def __new__(cls, kind: ResultKind, cause: str = "") -> ItemResult:
        self = super().__new__(cls, kind is ResultKind.OK)
        self.kind = kind
        self.cause = cause
        return self

    @property
    def ok(self) -> bool:
        return self.kind is ResultKind.OK

    def __repr__(self) -> str:
        return f"ItemResult(kind={self.kind.value!r}, cause={self.cause!r})"

    def __reduce__(self) -> tuple[type[ItemResult], tuple[ResultKind, str]]:
        return ItemResult, (self.kind, self.cause)


OK = ItemResult(ResultKind.OK)
MISS = ItemResult(ResultKind.MISS, "not found")


def result_from_status(code: int, stored_len: int = 0) -> ItemResult:
    """Map a per-item wire status to an `ItemResult`."""
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
    Status.BAD_MAC: "value bytes do not match their digest (corrupted or altered in transit)",
    Status.UNSUPPORTED: "the server does not implement this operation (upgrade it)",
}
