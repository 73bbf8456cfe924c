"""Per-item results of batch operations."""

from __future__ import annotations

import enum

from .errors import MemberDownError, MemKVError, MemKVTimeout, ServerError
from .protocol import Status, status_name

__all__ = ["ItemResult", "ResultKind", "failure_result", "result_from_status"]


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
    `int` equal to `True` or `False`). `kind` and `cause` keep the detail; for a
    `TRANSPORT` result, `member` names the server and `timed_out` / `member_down`
    tell a member that missed this call's deadline, or was skipped because it is
    marked down, from other connection failures (none of them means "absent").
    """

    kind: ResultKind
    cause: str
    member: str
    timed_out: bool
    member_down: bool

    def __new__(
        cls,
        kind: ResultKind,
        cause: str = "",
        member: str = "",
        timed_out: bool = False,
        member_down: bool = False,
    ) -> ItemResult:
        self = super().__new__(cls, kind is ResultKind.OK)
        self.kind = kind
        self.cause = cause
        self.member = member
        self.timed_out = timed_out
        self.member_down = member_down
        return self

    @property
    def ok(self) -> bool:
        return self.kind is ResultKind.OK

    def __repr__(self) -> str:
        extra = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("member", self.member),
                ("timed_out", self.timed_out),
                ("member_down", self.member_down),
            )
            if value
        )
        return f"ItemResult(kind={self.kind.value!r}, cause={self.cause!r}{extra})"

    def __reduce__(self) -> tuple[type[ItemResult], tuple[ResultKind, str, str, bool, bool]]:
        args = (self.kind, self.cause, self.member, self.timed_out, self.member_down)
        return ItemResult, args


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


def failure_result(exc: MemKVError | OSError, member: str) -> ItemResult:
    """The result of every item of a request to `member` that failed with `exc`."""
    if isinstance(exc, ServerError):
        return ItemResult(ResultKind.SERVER, str(exc), member)
    timed_out = isinstance(exc, MemKVTimeout)
    down = isinstance(exc, MemberDownError)
    return ItemResult(ResultKind.TRANSPORT, str(exc), member, timed_out, down)


_HINTS: dict[int, str] = {
    Status.VALUE_TOO_LARGE: "value exceeds the server's per-value limit (memory / lanes)",
    Status.NO_SPACE: "server could not free memory in time (values pinned by readers)",
    Status.TRANSFER_FAILED: "RDMA transfer failed",
    Status.BAD_MAC: "value bytes do not match their digest (corrupted or altered in transit)",
    Status.UNSUPPORTED: "the server does not implement this operation (upgrade it)",
}
