"""kv-eviction's own policies, registered in code when the package is imported: they work
from sources on PYTHONPATH or a vendored copy, with no installed metadata. A new built-in
is one line in `BUILT_INS`; policies of other distributions come as entry points
(`policy.register_policy`)."""

from __future__ import annotations

from . import auto, candidate, lru, marconi
from .policy import PolicyFactory, register_policy

BUILT_INS: dict[str, PolicyFactory] = {
    "auto": auto.build,
    "doorkeeper-lfu-decay-1": candidate.build_doorkeeper_lfu,
    "doorkeeper-lru": candidate.build_doorkeeper_lru,
    "lru": lru.build,
    "marconi": marconi.build,
    "probation-lru": candidate.build_probation_lru,
}

for _name, _factory in BUILT_INS.items():
    register_policy(_name, _factory)
