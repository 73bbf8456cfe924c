"""The weights fingerprint tells checkpoints apart, in a folder or as a hub snapshot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_kv_identity import weights_fingerprint
from vllm_kv_identity.weights import UNKNOWN


def checkpoint(folder: Path, payload: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(payload)
    return folder


def test_a_folder_fingerprint_changes_with_the_checkpoint(tmp_path: Path) -> None:
    first = weights_fingerprint(str(checkpoint(tmp_path / "a", b"a" * 300_000)))
    assert weights_fingerprint(str(checkpoint(tmp_path / "a", b"a" * 300_000))) == first
    other = checkpoint(tmp_path / "b", b"a" * 299_999 + b"b")
    assert weights_fingerprint(str(other)) != first


def test_host_local_also_sees_a_rewrite_the_samples_miss(tmp_path: Path) -> None:
    """A change outside the sampled bytes, at the same size: only the mtime tells."""
    folder = checkpoint(tmp_path / "m", b"a" * 1_000_000)
    shared, local = (
        weights_fingerprint(str(folder)),
        weights_fingerprint(str(folder), host_local=True),
    )
    shard = folder / "model.safetensors"
    shard.write_bytes(b"a" * 100_000 + b"b" + b"a" * 899_999)
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert weights_fingerprint(str(folder)) == shared  # portable across hosts: samples only
    assert weights_fingerprint(str(folder), host_local=True) != local


def hub_snapshot(cache: Path, model: str, commit: str, ref: str = "main") -> None:
    repo = cache / ("models--" + model.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)


def test_a_hub_id_is_fingerprinted_by_its_snapshot_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    hub_snapshot(tmp_path, "org/model", "1111111111111111aaaa")
    first = weights_fingerprint("org/model")
    assert first == "1111111111111111"
    hub_snapshot(tmp_path, "org/model", "2222222222222222bbbb")  # a new snapshot of main
    assert weights_fingerprint("org/model") == "2222222222222222"
    assert weights_fingerprint("org/model", "1111111111111111aaaa") == "1111111111111111"


def test_an_unknown_model_is_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert weights_fingerprint("org/absent") == UNKNOWN
