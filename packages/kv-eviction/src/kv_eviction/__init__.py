"""Chain-consistent eviction policies for KV-cache blocks and an admission filter: what
serving imports. Pure Python, no dependencies. The trace simulator and benchmark harness
live apart, in `kv_eviction.sim`.

    >>> from kv_eviction import make_policy
    >>> policy = make_policy("marconi", decay=0.0, reuse_mode="linear")
    >>> policy.insert("a"); policy.insert("b", parent="a", depth=1)
    >>> policy.pop_victims(2)
    ['b', 'a']
"""

from . import builtin_policies  # noqa: F401  (registers the built-in policies)
from ._version import __version__
from .admission import AdmissionTracker
from .auto import AutoPolicy
from .candidate import RulePolicy
from .chainheap import ChainHeapPolicy
from .lru import LRUPolicy
from .marconi import REUSE_MODES, MarconiPolicy
from .policy import (
    ENTRY_POINT_GROUP,
    EvictionPolicy,
    PolicyStats,
    make_policy,
    policy_names,
    register_policy,
    validate_policy,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "REUSE_MODES",
    "AdmissionTracker",
    "AutoPolicy",
    "ChainHeapPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "MarconiPolicy",
    "PolicyStats",
    "RulePolicy",
    "__version__",
    "make_policy",
    "policy_names",
    "register_policy",
    "validate_policy",
]
