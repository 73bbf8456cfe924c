"""Open MemKV client (TCP, and RDMA through pyverbs) and server.

`Client` mirrors the vendor client's API; see the package README and
`docs/memkv-protocol.md`.
"""

from ._version import __version__
from .client import Client
from .config import Config, ConfigSources, RawSetting, Transport, load_config
from .errors import (
    AuthError,
    BadMacError,
    ClockDriftError,
    ConfigError,
    KeyTooLongError,
    LocalProtocolError,
    MemberDownError,
    MemKVError,
    MemKVTimeout,
    NoSpaceError,
    ProtocolError,
    RdmaUnavailableError,
    RemoteProtocolError,
    ReplayError,
    ServerError,
    TransportError,
    ValueTooLargeError,
)
from .health import MemberHealth
from .results import ItemResult, ResultKind
from .topology import choose_nic, host_has_nic_per_gpu, rdma_affinity, select_rail

__all__ = [
    "AuthError",
    "BadMacError",
    "Client",
    "ClockDriftError",
    "Config",
    "ConfigError",
    "ConfigSources",
    "ItemResult",
    "KeyTooLongError",
    "LocalProtocolError",
    "MemKVError",
    "MemKVTimeout",
    "MemberDownError",
    "MemberHealth",
    "NoSpaceError",
    "ProtocolError",
    "RawSetting",
    "RdmaUnavailableError",
    "RemoteProtocolError",
    "ReplayError",
    "ResultKind",
    "ServerError",
    "Transport",
    "TransportError",
    "ValueTooLargeError",
    "__version__",
    "choose_nic",
    "host_has_nic_per_gpu",
    "load_config",
    "rdma_affinity",
    "select_rail",
]
