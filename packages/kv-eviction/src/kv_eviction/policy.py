"""The eviction-policy interface, its statistics record and the name registry.

A policy tracks cached block keys and picks victims; it stores no data. Keys form
prefix chains: every key may name a tracked `parent`. A key that still has a tracked
descendant is never returned as a victim (evicting it would orphan the descendant,
which could then never hit again), and pinned keys are never returned either.

Call pattern (one owner, no threads): `insert` a key when its block is stored,
`touch` it on every hit, `pin`/`unpin` around loads and stores in flight,
`pop_victims(n)` when space is needed, `tick()` whenever the caller's clock advances
(for example once per scheduler step or per request).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, cast

from .retention import Retention

__all__ = [
    "ENTRY_POINT_GROUP",
    "EvictionPolicy",
    "PolicyStats",
    "make_policy",
    "policy_names",
    "register_policy",
    "validate_policy",
]


@dataclass(frozen=True)
class PolicyStats:
    """Counters of one policy instance."""

    policy: str
    """Registered name of the policy (`lru`, `marconi`, ...)."""
    entries: int
    """Keys tracked now."""
    pinned: int
    """Tracked keys with a pin count above zero."""
    inserts: int
    touches: int
    evictions: int
    """Keys returned by `pop_victims`."""
    removals: int
    """Keys forgotten through `remove`."""
    now: int
    """The tick clock."""
    heap_size: int
    """Heap items held, stale ones included (memory diagnostics)."""
    compactions: int
    """Heap rebuilds that dropped stale items."""


class EvictionPolicy(ABC):
    """Chooses which cached blocks to evict. Keys are any hashable values."""

    name: str = ""

    @abstractmethod
    def insert(
        self,
        key: Hashable,
        parent: Hashable | None = None,
        depth: int = 0,
        retention: Retention = Retention.NORMAL,
    ) -> None:
        """Track a newly stored block.

        `parent` is the key of the previous block in the prefix chain; a parent that is
        not tracked is ignored (the key becomes a chain root). `depth` is the block's
        index in its chain (0 for the first block). `retention` is the caller's hint
        (`kv_eviction.retention`): every HIGH key goes after every NORMAL one, every LOW
        key before them. Raises `KeyError` if `key` is already tracked.
        """

    @abstractmethod
    def touch(self, key: Hashable) -> None:
        """Record a hit on `key` (reuse count and recency). `KeyError` if untracked."""

    @abstractmethod
    def remove(self, key: Hashable) -> None:
        """Forget `key` (whatever its pins or children). `KeyError` if untracked."""

    @abstractmethod
    def pin(self, key: Hashable) -> None:
        """Protect `key` from eviction; pins nest. `KeyError` if untracked."""

    @abstractmethod
    def unpin(self, key: Hashable) -> None:
        """Undo one `pin`. `KeyError` if untracked, `ValueError` if not pinned."""

    @abstractmethod
    def pop_victims(self, n: int) -> list[Hashable]:
        """Remove and return up to `n` victims, lowest priority first.

        Only unpinned keys without a tracked child are eligible; evicting a child can
        make its parent eligible within the same call. Returns fewer than `n` keys
        when no more are eligible.
        """

    @abstractmethod
    def tick(self, n: int = 1) -> None:
        """Advance the age clock by `n` ticks."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of tracked keys."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether `key` is tracked."""

    @abstractmethod
    def stats(self) -> PolicyStats:
        """A snapshot of the policy's counters."""


PolicyFactory = Callable[..., EvictionPolicy]
ENTRY_POINT_GROUP = "kv_eviction.policies"
_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make `factory(**options)` available as `make_policy(name, **options)` in this process.

    kv-eviction registers its own policies this way (`builtin_policies`), so they need no
    installed metadata. A name registered here wins over an entry point of the same name.
    Another distribution declares policies without code instead, as entry points of group
    `kv_eviction.policies` whose objects are such factories:

        [project.entry-points."kv_eviction.policies"]
        my-policy = "my_package.my_module:build"
    """
    _REGISTRY[name] = factory


def _declared() -> dict[str, list[EntryPoint]]:
    """The installed distributions' policy entry points by name, one per target."""
    found: dict[str, list[EntryPoint]] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        same_name = found.setdefault(entry.name, [])
        if all(other.value != entry.value for other in same_name):
            same_name.append(entry)
    return found


def _origin(entry: EntryPoint) -> str:
    dist = entry.dist
    where = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"{entry.value!r} ({where})"


def policy_names() -> list[str]:
    """Policy names `make_policy` accepts (registered, the built-ins included, or installed
    as entry points), sorted."""
    return sorted(set(_REGISTRY) | set(_declared()))


def _factory(name: str) -> PolicyFactory:
    """The factory of `name`: registered in this process, else loaded from its entry point
    (once; later calls find it registered)."""
    factory = _REGISTRY.get(name)
    if factory is not None:
        return factory
    entries = _declared().get(name, [])
    if not entries:
        raise ValueError(
            f"eviction policy {name!r} is unknown; accepted values: {', '.join(policy_names())}"
        )
    if len(entries) > 1:
        raise ValueError(
            f"eviction policy {name!r} is declared by more than one installed distribution "
            f"(entry-point group {ENTRY_POINT_GROUP!r}): "
            f"{', '.join(_origin(entry) for entry in entries)}; uninstall all but one"
        )
    try:
        loaded = entries[0].load()
    except Exception as exc:
        raise ImportError(
            f"eviction policy {name!r}: its entry point {_origin(entries[0])} does not load: {exc}"
        ) from exc
    if not callable(loaded):
        raise TypeError(
            f"eviction policy {name!r}: entry point {_origin(entries[0])} names "
            f"{type(loaded).__name__} {loaded!r}, not a factory"
        )
    _REGISTRY[name] = loaded
    return cast(PolicyFactory, loaded)


def make_policy(name: str, **options: Any) -> EvictionPolicy:
    """Build the policy registered or installed as `name`, validating every option.

    Raises `ValueError` naming the bad option (or name) and the accepted values, and
    `TypeError` if the factory does not return an `EvictionPolicy`.
    """
    policy = _factory(name)(**options)
    if not isinstance(policy, EvictionPolicy):
        raise TypeError(
            f"eviction policy {name!r}: its factory returned {type(policy).__name__}, "
            "not an EvictionPolicy"
        )
    return policy


def validate_policy(name: object, options: object = None) -> None:
    """Check a policy configuration the way `make_policy(name, **options)` would.

    `name` must be a registered name and `options` a mapping of option names to values
    that the policy accepts (None means no options). Raises `ValueError` naming the bad
    name or option and the accepted values; the policy built to check is discarded. This
    is the one place configuration layers (kvpool-mmap, the connector) ask, so a newly
    registered policy and its options need no edit there.
    """
    if not isinstance(name, str):
        raise ValueError(
            f"eviction policy must be a name; got {name!r}; accepted values: "
            f"{', '.join(policy_names())}"
        )
    if options is None:
        options = {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ValueError(
            f"options of eviction policy {name!r} must be a mapping of option names to "
            f"values; got {options!r}"
        )
    make_policy(name, **options)


def reject_unknown_options(policy: str, options: dict[str, Any], accepted: tuple[str, ...]) -> None:
    """Raise `ValueError` if `options` holds a key outside `accepted`."""
    for option in options:
        if option not in accepted:
            allowed = ", ".join(accepted) if accepted else "none"
            raise ValueError(
                f"option {option!r} is not accepted by eviction policy {policy!r}; "
                f"accepted options: {allowed}"
            )
