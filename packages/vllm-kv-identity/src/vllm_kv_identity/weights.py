"""A fingerprint of the loaded weights, so a new checkpoint never restores old KV.

* A local folder: blake2b over `config.json` plus, per `*.safetensors` / `*.bin` /
  `*.pt` shard, its name, size, header (first 64 KiB) and two more 64 KiB samples
  (middle, end). With `host_local`, also each shard's mtime: any rewrite then changes
  the fingerprint, but so does a copy to another host.
* A hub id with a local snapshot: the snapshot commit hash (from the HF cache refs of
  `revision`, default `main`), so a new snapshot under the same id and no revision
  gets a new fingerprint.
* Otherwise `"unknown"`, with a warning (callers still key by the model name).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["UNKNOWN", "weights_fingerprint"]

log = logging.getLogger("vllm.kv_identity")  # under vLLM's handlers
SAMPLE = 64 << 10
SHARD_SUFFIXES = (".safetensors", ".bin", ".pt")
UNKNOWN = "unknown"


def _sample_file(h: Any, path: Path, host_local: bool) -> None:
    stat = path.stat()
    h.update(f"{path.name}:{stat.st_size}".encode())
    if host_local:
        h.update(f":{stat.st_mtime_ns}".encode())
    with path.open("rb") as handle:
        for offset in (0, max(0, stat.st_size // 2 - SAMPLE // 2), max(0, stat.st_size - SAMPLE)):
            handle.seek(offset)
            h.update(handle.read(SAMPLE))


def _folder_fingerprint(folder: Path, host_local: bool) -> str:
    h = hashlib.blake2b(digest_size=8)
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    shards = sorted(p for p in folder.iterdir() if p.suffix in SHARD_SUFFIXES and p.is_file())
    for shard in shards:
        _sample_file(h, shard, host_local)
    return h.hexdigest()


def _hub_commit(model: str, revision: str | None) -> str | None:
    cache = Path(
        os.environ.get("HF_HUB_CACHE")
        or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    )
    repo = cache / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / (revision or "main")
    if ref.is_file():
        return ref.read_text().strip()[:16]
    if revision and len(revision) >= 7 and (repo / "snapshots" / revision).is_dir():
        return revision[:16]
    return None


def weights_fingerprint(
    model: str, revision: str | None = None, *, host_local: bool = False
) -> str:
    """A short hex fingerprint of the checkpoint `model` (a folder or a hub id) names.

    `host_local`: the KV is only ever reused on this host (a disk tier), so shard mtimes
    may count too. Read afresh on every call (a few small reads per shard).
    """
    path = Path(model)
    if path.is_dir():
        return _folder_fingerprint(path, host_local)
    commit = _hub_commit(model, revision)
    if commit is None:
        log.warning(
            "cannot fingerprint the weights of %r (no local folder or hub snapshot); a new "
            "checkpoint under this name would reuse old KV",
            model,
        )
        return UNKNOWN
    return commit
