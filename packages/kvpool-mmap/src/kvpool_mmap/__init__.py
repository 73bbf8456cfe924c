"""Tiered slab store for KV-cache blocks: a pinned mmap L1 (tmpfs) and a crash-safe L2 (disk).

    >>> store = TieredStore(config)                 # standalone: creates the L1 rank files
    >>> ticket = store.begin_store(keys)            # pinned L1 slots to write
    >>> store.l1_files[0].array[ticket.l1_slots[0]] = block_bytes
    >>> store.commit_store(ticket)                  # visible; written through to L2
    >>> load = store.begin_load(keys); store.poll_load(load); store.end_load(load)

In vLLM, workers map their rank's L1 file with `open_l1_rank(config, rank, create=True)`
and the scheduler owns `TieredStore(config, create_l1=False)`.
"""

from kv_offload_settings import (
    SIZE_EXAMPLES,
    Setting,
    expose,
    markdown_table,
    parse_size,
    setting,
    settings_of,
)

from ._codec import FORMAT_VERSION
from ._config import (
    DIRECT_IO_MODES,
    FSYNC_MODES,
    HEADER_BYTES,
    L1_OVERFLOW_MODES,
    MAX_IO_THREADS,
    MAX_KEY_BYTES,
    MAX_TIER_BYTES,
    PAGE,
    L1Overflow,
    StoreConfig,
    TierConfig,
    check_pool_path,
    store_settings,
)
from ._errors import (
    ConfigError,
    InsufficientSpaceError,
    KvPoolError,
    LayoutMismatchError,
    PoolInUseError,
)
from ._l1 import L1RankFile, open_l1_rank
from ._pools import (
    PoolFile,
    check_l1_room,
    inspect_pool_file,
    pool_files,
    remove_if_stale,
    remove_stale_l1,
)
from ._recovery import RecoveredBlock, RecoveryReport, check_l2, check_l2_files
from ._store import TieredStore
from ._types import LoadStatus, LoadTicket, StoreStats, StoreTicket, Tier
from ._version import __version__

__all__ = [
    "DIRECT_IO_MODES",
    "FORMAT_VERSION",
    "FSYNC_MODES",
    "HEADER_BYTES",
    "L1_OVERFLOW_MODES",
    "MAX_IO_THREADS",
    "MAX_KEY_BYTES",
    "MAX_TIER_BYTES",
    "PAGE",
    "SIZE_EXAMPLES",
    "ConfigError",
    "InsufficientSpaceError",
    "KvPoolError",
    "L1Overflow",
    "L1RankFile",
    "LayoutMismatchError",
    "LoadStatus",
    "LoadTicket",
    "PoolFile",
    "PoolInUseError",
    "RecoveredBlock",
    "RecoveryReport",
    "Setting",
    "StoreConfig",
    "StoreStats",
    "StoreTicket",
    "Tier",
    "TierConfig",
    "TieredStore",
    "__version__",
    "check_l1_room",
    "check_l2",
    "check_l2_files",
    "check_pool_path",
    "expose",
    "inspect_pool_file",
    "markdown_table",
    "open_l1_rank",
    "parse_size",
    "pool_files",
    "remove_if_stale",
    "remove_stale_l1",
    "setting",
    "settings_of",
    "store_settings",
]
