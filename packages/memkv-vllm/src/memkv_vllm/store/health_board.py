"""`HealthBoard`: the members one engine's processes found down, shared between them.

An engine's scheduler (EngineCore) and its workers each open their own store: with vLLM's
multiprocessing or tensor parallelism they are separate processes, and in one process
still separate clients. Each keeps its own down/up record, so without sharing a stopped
member would cost the scheduler's `exists` lookups one stall budget and the workers' loads
another. The board carries the first verdict to every other store of the engine:

* A store that finds a member down (a missed deadline, a refused connection) writes a mark:
  a file `<engine>-<member>.down` (both hashed) in a per-user folder under `/dev/shm`
  (else the temporary folder), holding its owner: pid and a token unique per store.
* Before every call a store reads the marks of the members it would use (one failed
  `open` per member while all are up). A member marked by another live owner is skipped
  at once, as if this store had found it down itself: its keys read as absent, its items
  are `unavailable`; the store counts and logs that transition (`adopted`).
* The owner removes the mark when its own background probe finds the member answering;
  a mark whose owner process has died is ignored and removed.

So one stop costs the engine one budget: the first call to meet the member, in whichever
process. Calls already waiting on it elsewhere when it stopped end within their own
deadline, in parallel. A board for no engine (`engine=None`: one store does everything,
as the tier does) shares nothing. No vLLM import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = ["HealthBoard", "board_folder"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
WATCH_INTERVAL_S = 0.05
"""How often the owner of a mark checks whether its own record has the member up again."""


def board_folder() -> Path:
    """This user's folder of marks: on `/dev/shm` (memory), else the temporary folder."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"memkv-vllm-health-{os.getuid()}"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class HealthBoard:
    """One store's view of engine `engine`'s marks (None: a board that shares nothing).

    Thread-safe. `folder` defaults to `board_folder()`; a folder that cannot be created
    disables sharing (logged once).
    """

    def __init__(self, engine: str | None, folder: Path | None = None) -> None:
        self._token = f"{os.getpid()}:{secrets.token_hex(8)}"
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._adopted: set[str] = set()  # members this store skips for another's mark
        self.went_down: dict[str, int] = {}
        self.came_up: dict[str, int] = {}
        self._folder: Path | None = None
        self._prefix = ""
        if engine is None:
            return
        folder = folder or board_folder()
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            log.warning("memkv-vllm: members found down are not shared between this engine's "
                        "processes (%s: %s)", folder, exc)  # fmt: skip
            return
        self._folder = folder
        self._prefix = _digest(engine)

    def _path(self, member: str) -> Path:
        assert self._folder is not None
        return self._folder / f"{self._prefix}-{_digest(member)}.down"

    def _owner(self, member: str) -> str | None:
        """The live owner of `member`'s mark, or None (no mark, or a dead owner's)."""
        path = self._path(member)
        try:
            owner = path.read_text()
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        except OSError:
            return None
        pid, _, _ = owner.partition(":")
        if not pid.isdigit() or not psutil.pid_exists(int(pid)):
            path.unlink(missing_ok=True)  # its owner died: nobody will clear it
            return None
        return owner

    def skip(self, member: str) -> bool:
        """Whether another store of this engine found `member` down (and it still is, as
        far as that store knows); logs and counts this store following or leaving it."""
        if self._folder is None:
            return False
        owner = self._owner(member)
        by = owner.partition(":")[0] if owner is not None and owner != self._token else None
        with self._lock:
            if (by is not None) == (member in self._adopted):
                return by is not None
            if by is not None:
                self._adopted.add(member)
                self.went_down[member] = self.went_down.get(member, 0) + 1
            else:
                self._adopted.discard(member)
                self.came_up[member] = self.came_up.get(member, 0) + 1
        if by is not None:
            log.warning("memkv-vllm: %s is down (found by process %s of this engine); skipped "
                        "here too", member, by)  # fmt: skip
        else:
            log.warning("memkv-vllm: %s is up again (for this engine)", member)
        return by is not None

    def found_down(self, member: str, still_down: Callable[[], bool]) -> None:
        """This store found `member` down: mark it for the engine's other stores until
        `still_down()` (this store's own record, checked on a thread) turns False."""
        if self._folder is None or self._closed.is_set():
            return
        path = self._path(member)
        spare = path.with_suffix(f".{self._token.replace(':', '-')}")
        try:
            spare.write_text(self._token)
            os.replace(spare, path)
        except OSError as exc:
            log.debug("memkv-vllm: could not mark %s down for this engine: %s", member, exc)
            return
        threading.Thread(target=self._clear_when_up, args=(member, still_down),
                         name="memkv-board", daemon=True).start()  # fmt: skip

    def _clear_when_up(self, member: str, still_down: Callable[[], bool]) -> None:
        while still_down() and not self._closed.wait(WATCH_INTERVAL_S):
            pass
        if self._owner(member) == self._token:
            self._path(member).unlink(missing_ok=True)

    def close(self) -> None:
        """Stop watching (marks this store owns are removed by their watchers)."""
        self._closed.set()
