"""One Mooncake Store process that mounts a memory segment into the pool and serves it.

Usage: python mooncake_segment.py MASTER METADATA_URL SEGMENT_MB. Prints `READY` once
mounted, then serves until it is killed (SIGTERM unmounts cleanly; SIGKILL is a crash).
"""

from __future__ import annotations

import os
import signal
import sys
import time

os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # advertise loopback only

from mooncake.store import MooncakeDistributedStore


def main() -> int:
    master, metadata, segment_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, segment_mb << 20, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(f"FAILED {rc}", flush=True)
        return 1
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("READY", flush=True)
    while not stop:
        time.sleep(0.2)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
