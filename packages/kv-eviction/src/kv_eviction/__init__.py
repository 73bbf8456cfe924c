"""Chain-consistent eviction policies for KV-cache blocks, an admission filter and a
trace simulator. Pure Python, no dependencies.

    >>> from kv_eviction import make_policy
    >>> policy = make_policy("marconi", decay=0.0, reuse_mode="linear")
    >>> policy.insert("a"); policy.insert("b", parent="a", depth=1)
    >>> policy.pop_victims(2)
    ['b', 'a']
"""

from ._version import __version__
from .admission import AdmissionTracker
from .auto import AutoPolicy
from .belady import BeladyPolicy
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
from .simulator import SimResult, simulate
from .trace import Request, Trace

__all__ = [
    "ENTRY_POINT_GROUP",
    "REUSE_MODES",
    "AdmissionTracker",
    "AutoPolicy",
    "BeladyPolicy",
    "ChainHeapPolicy",
    "EvictionPolicy",
    "LRUPolicy",
    "MarconiPolicy",
    "PolicyStats",
    "Request",
    "RulePolicy",
    "SimResult",
    "Trace",
    "__version__",
    "make_policy",
    "policy_names",
    "register_policy",
    "simulate",
    "validate_policy",
]
