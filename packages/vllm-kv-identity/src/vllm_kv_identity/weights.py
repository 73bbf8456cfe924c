"""A fingerprint of the loaded weights, so a new checkpoint never restores old KV.

* A hub id with a local snapshot: the snapshot commit hash (from the HF cache refs).
* A local folder: blake2b over ``config.json`` plus, per ``*.safetensors`` / ``*.bin``
  shard, its name, size, header (first 64 KiB) and two more 64 KiB samples (middle, end).
* Otherwise ``"unknown"``, with one warning (keys still carry the model name).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["weights_fingerprint"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
SAMPLE = 64 << 10
_cache: dict[str, str] = {}


def _sample_file(h: Any, path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as handle:
        for offset in (0, max(0, size // 2 - SAMPLE // 2), max(0, size - SAMPLE)):
            handle.seek(offset)
            h.update(handle.read(SAMPLE))


def _folder_fingerprint(folder: Path) -> str:
    h = hashlib.blake2b(digest_size=8)
    config = folder / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    shards = sorted(
        p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file()
    )
    for shard in shards:
        _sample_file(h, shard)
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


def weights_fingerprint(model: str, revision: str | None = None) -> str:
    """A short hex fingerprint of the checkpoint ``model`` names (cached per process)."""
    key = f"{model}@{revision}"
    if key in _cache:
        return _cache[key]
    path = Path(model)
    if path.is_dir():
        fp = _folder_fingerprint(path)
    else:
        commit = _hub_commit(model, revision)
        if commit is None:
            log.warning(
                "memkv-vllm: cannot fingerprint the weights of %r (no local folder or hub "
                "snapshot); a new checkpoint under this name would reuse old KV",
                model,
            )
            commit = "unknown"
        fp = commit
    _cache[key] = fp
    return fp
