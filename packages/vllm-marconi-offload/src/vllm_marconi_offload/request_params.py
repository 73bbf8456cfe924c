"""Per-request cache controls read from a request's `kv_transfer_params`.

The keys and their meaning are those of vLLM's own OffloadingConnector, so a client that
steers it steers us unchanged:

* `max_offload_tokens` (int >= 0): store at most the request's first N tokens (0: store
  nothing of it, in any tier).
* `max_load_tokens` (int >= 0): load at most N tokens beyond what vLLM's own cache had.
* `kv_load_tiers` (list of `{"medium": ..., "locality": ...}`): load only from tiers that
  some entry matches (an entry without a field matches any value of it; `[]`: load
  nothing). Our L1 is medium `CPU`, our L2 `STORAGE`, both locality `LOCAL`.

and one none of vLLM's connectors has:

* `offload_priority` (`"high"`, `"normal"`, `"low"`): how long the request's blocks stay.
  The eviction policies evict every high block after every normal one and every low one
  before them; low blocks are never written to L2.

Unlike vLLM, which logs and ignores a bad value, a request with one is served without
offloading at all (nothing loaded, nothing stored): a cache instruction we could not read
must not leave its prompt behind. The error names the key, the value and the accepted
form; it is logged and returned in the response's `kv_transfer_params`
(`marconi_offload_error`). Other keys (another connector's) are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kv_eviction.retention import Retention
from kvpool_mmap import Tier
from vllm_kv_identity.vocabulary import (
    KV_LOAD_TIERS,
    LOCAL,
    LOCALITIES,
    MAX_LOAD_TOKENS,
    MAX_OFFLOAD_TOKENS,
    MEDIA,
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    OFFLOAD_PRIORITIES,
    OFFLOAD_PRIORITY,
    offload_priority_error,
)

ERROR_KEY = "marconi_offload_error"
"""The response's `kv_transfer_params` key that carries a rejected request's error."""

TIER_PLACES = {Tier.L1: (MEDIUM_CPU, LOCAL), Tier.L2: (MEDIUM_STORAGE, LOCAL)}
"""Each tier's (medium, locality) as `kv_load_tiers` and the KV events name them."""


class RequestParamsError(ValueError):
    """A `kv_transfer_params` value is invalid; the message names the key and value."""


@dataclass(frozen=True)
class RequestParams:
    """A request's cache controls (defaults: no limits, every tier, normal priority)."""

    max_offload_tokens: int | None = None
    max_load_tokens: int | None = None
    load_tiers: frozenset[Tier] = frozenset(TIER_PLACES)
    retention: Retention = Retention.NORMAL
    error: str | None = None
    """Why the request's controls were rejected (it is then served without offload)."""

    @classmethod
    def from_request(cls, params: Mapping[str, Any] | None) -> RequestParams:
        """Parse `kv_transfer_params`; a bad value gives `rejected(error)`."""
        if not params:
            return DEFAULT
        if not isinstance(params, Mapping):
            return cls.rejected(f"kv_transfer_params must be a JSON object; got {params!r}")
        try:
            return cls.parse(params)
        except RequestParamsError as exc:
            return cls.rejected(str(exc))

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> RequestParams:
        """Parse `kv_transfer_params`; `RequestParamsError` names the first bad key."""
        tiers = params.get(KV_LOAD_TIERS)
        priority = params.get(OFFLOAD_PRIORITY)
        if priority is not None and priority not in OFFLOAD_PRIORITIES:
            raise RequestParamsError(offload_priority_error(priority))
        retention = Retention.NORMAL if priority is None else Retention[priority.upper()]
        return cls(
            max_offload_tokens=_tokens(params, MAX_OFFLOAD_TOKENS),
            max_load_tokens=_tokens(params, MAX_LOAD_TOKENS),
            load_tiers=frozenset(TIER_PLACES) if tiers is None else _load_tiers(tiers),
            retention=retention,
        )

    @classmethod
    def rejected(cls, error: str) -> RequestParams:
        """Controls of a request served without offload."""
        return cls(max_offload_tokens=0, max_load_tokens=0, load_tiers=frozenset(), error=error)

    @property
    def loads(self) -> bool:
        return self.max_load_tokens != 0 and bool(self.load_tiers)

    def offload_blocks(self, blocks: int, block_size: int) -> int:
        """How many of the request's first `blocks` full blocks it lets us store."""
        if self.max_offload_tokens is None:
            return blocks
        return min(blocks, self.max_offload_tokens // block_size)

    def load_blocks(self, blocks: int, num_computed_tokens: int, block_size: int) -> int:
        """How many leading blocks a hit may end at, given vLLM's own hit."""
        if self.max_load_tokens is None:
            return blocks
        return min(blocks, (num_computed_tokens + self.max_load_tokens) // block_size)


DEFAULT = RequestParams()


def _tokens(params: Mapping[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise RequestParamsError(
            f"kv_transfer_params[{key!r}] must be an integer >= 0 (a token count); got {value!r}"
        )
    return value


def _load_tiers(value: object) -> frozenset[Tier]:
    form = (
        f"a list of {{'medium': one of {list(MEDIA)}, 'locality': one of "
        f"{list(LOCALITIES)}}} entries (either field may be left out)"
    )
    if not isinstance(value, list):
        raise RequestParamsError(
            f"kv_transfer_params[{KV_LOAD_TIERS!r}] must be {form}; got {value!r}"
        )
    allowed: set[Tier] = set()
    for entry in value:
        if not isinstance(entry, dict) or set(entry) - {"medium", "locality"}:
            raise RequestParamsError(
                f"kv_transfer_params[{KV_LOAD_TIERS!r}] must be {form}; got entry {entry!r}"
            )
        medium = _upper(entry.get("medium"), MEDIA, "medium", form)
        locality = _upper(entry.get("locality"), LOCALITIES, "locality", form)
        for tier, (tier_medium, tier_locality) in TIER_PLACES.items():
            if medium in (None, tier_medium) and locality in (None, tier_locality):
                allowed.add(tier)
    return frozenset(allowed)


def _upper(value: object, accepted: tuple[str, ...], field: str, form: str) -> str | None:
    """A medium or locality in vLLM's spelling (it upper-cases what clients send)."""
    if value is None:
        return None
    if isinstance(value, str) and value.upper() in accepted:
        return value.upper()
    raise RequestParamsError(
        f"kv_transfer_params[{KV_LOAD_TIERS!r}] {field} {value!r} is unknown; it must be {form}"
    )
