"""The research harness, apart from the runtime policies: the trace simulator with
Bélády's offline optimum, trace readers and generators (`mooncake`, `sharegpt`,
`synthetic`), the `kv-eviction` CLI (`cli`, `plot`) and the per-operation benchmark
(`python -m kv_eviction.sim.bench`). Serving code never imports it.

    >>> from kv_eviction import make_policy
    >>> from kv_eviction.sim import Request, Trace, simulate
    >>> trace = Trace("tiny", 16, [Request(0.0, ("a", "b"), 32), Request(1.0, ("a", "b"), 32)])
    >>> simulate(trace, make_policy("lru"), capacity=2).token_hit_rate
    0.5
"""

from .belady import BeladyPolicy
from .simulator import SimResult, simulate
from .trace import Request, Trace

__all__ = ["BeladyPolicy", "Request", "SimResult", "Trace", "simulate"]
