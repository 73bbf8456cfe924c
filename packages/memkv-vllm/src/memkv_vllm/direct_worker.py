"""Worker side of direct mode: live KV blocks <-> MemKV through per-thread scratch slots.

One value per (block, rank): the block's pages of every layer of its KV cache group,
gathered into one scratch slot (so the value length is that group's per-block size; the
slot is sized for the widest group). At startup the worker derives its key prefix from
the model, weights fingerprint, dtype, TP size, block size and KV layout, and publishes it
for the scheduler to adopt.

vLLM (0.26 - 0.33) asserts that every transfer succeeded. A store that MemKV refused is
therefore reported as done (the scheduler never trusts stores: lookups ask MemKV). A load
that could not fill every block (the value vanished between lookup and load) is reported
as done only under `.connector.MemKVOffloadingConnector`, which hands the unfilled
block ids to vLLM's recompute path in the same step (`.load_errors`); under the
plain `OffloadingConnector` it is reported as failed, which vLLM turns into an engine
error rather than silently using wrong KV.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_kv_identity import key_group, weights_fingerprint
from vllm_kv_identity.block_copy import BlockCopier, mark

from . import _compat as c
from .jobs import JobOutcome, JobRunner
from .load_errors import current as current_load_errors
from .naming import direct_key, prefix_record, publish_key, split_prefix_record
from .store import ItemOutcome, open_store

if TYPE_CHECKING:
    import numpy as np
    import torch
    from vllm.v1.kv_offload.base import CanonicalKVCaches, GPULoadStoreSpec, TransferResult
    from vllm.v1.kv_offload.config import OffloadingConfig

    from .config import DirectConfig
    from .load_store_spec import MemKVLoadStoreSpec
    from .store import StoreConfig

__all__ = ["MemKVDirectWorker", "choose_scratch_medium"]

log = logging.getLogger("vllm.memkv_vllm")  # under vLLM's handlers
MAX_BLOCKS_PER_OP = 64


_Planned = tuple[bytes, int, int]
"""One block of a job: (MemKV name, KV cache group, GPU block id)."""


@dataclass
class _PartDone:
    """What one part of a job moved, and where its time went."""

    nbytes: int = 0
    failed_blocks: list[int] = field(default_factory=list)
    missing: list[bytes] = field(default_factory=list)  # loads: keys MemKV did not have
    unavailable: list[ItemOutcome] = field(default_factory=list)  # member timed out/down
    network_s: float = 0.0
    copy_s: float = 0.0


def _parts(plan: list[_Planned], size: int) -> list[list[_Planned]]:
    """`plan` in consecutive parts of at most `size` blocks."""
    return [plan[start : start + size] for start in range(0, len(plan), size)]


def choose_scratch_medium(setting: str, device: torch.device, has_rdma: bool) -> str:
    """`host` or `gpu` for `memkv_scratch_medium` = auto|host|gpu on this rank."""
    if device.type != "cuda":
        if setting == "gpu":
            log.warning("memkv-vllm: memkv_scratch_medium=gpu needs a CUDA device; using host")
        return "host"
    if setting == "auto":
        from memkv_client.topology import choose_nic

        local = choose_nic(device.index or 0).level == "PIX"  # a NIC on the GPU's switch
        setting = "gpu" if has_rdma and local else "host"
    if setting == "gpu":
        # memkv-client moves host memory only (no device-memory registration yet)
        log.warning(
            "memkv-vllm: GPU scratch is not available with this memkv-client (host memory "
            "only); staging through host memory"
        )
        return "host"
    return setting


class MemKVDirectWorker(c.OffloadingWorker):  # type: ignore[misc]
    """The worker side of `.spec.MemKVOffloadingSpec` on one rank of `config`'s engine,
    over that rank's live KV caches."""

    def __init__(
        self,
        cfg: DirectConfig,
        store_config: StoreConfig,
        config: OffloadingConfig,
        tokens_per_block: list[int],
        kv_caches: CanonicalKVCaches,
    ) -> None:
        import torch

        self.rank = int(config.parallel.rank)
        self._cfg = cfg
        self._tensors: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            tensor = t.tensor if t.tensor.dim() == 2 else t.tensor.reshape(t.tensor.shape[0], -1)
            if tensor.untyped_storage().data_ptr() != t.tensor.untyped_storage().data_ptr():
                raise RuntimeError("memkv-vllm: a KV cache tensor is not addressable per block")
            self._tensors.append(tensor.view(torch.int8))
        self._groups = [
            [(int(r.tensor_idx), int(r.page_size_bytes)) for r in refs]
            for refs in kv_caches.group_data_refs
        ]
        self._value_bytes = [sum(ps for _, ps in g) for g in self._groups]
        self._slot = max(self._value_bytes)
        budget = cfg.memkv_scratch_mb_per_thread << 20
        self._blocks_per_op = max(1, min(MAX_BLOCKS_PER_OP, budget // self._slot))
        device = self._device = self._tensors[0].device
        self._kv = open_store(
            store_config,
            False,
            f"direct worker rank {self.rank}",
            gpu=device.index if device.type == "cuda" else None,
            engine=config.engine_id,  # shares what it finds down with the scheduler's store
        )
        has_rdma = self._kv.has_rdma
        self.medium = choose_scratch_medium(cfg.memkv_scratch_medium, device, has_rdma)
        if not has_rdma:
            log.warning(
                "memkv-vllm: no RDMA on this host; direct offload moves KV over TCP from "
                "host scratch (works, but slower than GPUDirect RDMA)"
            )
        ident = {
            "model": config.model.name,
            "dtype": str(config.model.dtype),
            "tp_size": int(config.parallel.tp_size),
            "world_size": int(config.parallel.world_size),
            "tokens_per_block": list(tokens_per_block),
            "layout": [
                [list(t.tensor.shape[1:]), int(t.page_size_bytes)] for t in kv_caches.tensors
            ],
            "groups": self._groups,
            "kv_cache_layout": c.kv_cache_layout(config),
        }
        record = prefix_record(ident, weights_fingerprint(config.model.name), cfg.memkv_spec_prefix)
        self.prefix, _ = split_prefix_record(record)
        self._kv.put_record(publish_key(config.engine_id, self.rank), record)
        n = cfg.memkv_num_threads
        self._jobs = JobRunner(n, n, max_backlog_bytes=1 << 62)
        # a job's parts (up to `_blocks_per_op` blocks each) run on these threads, each with
        # its own copier: one part's MemKV transfer overlaps another's GPU copies
        self._part_pool = ThreadPoolExecutor(n, thread_name_prefix="memkv-direct-part")
        self._local = threading.local()
        self._load_errors = current_load_errors()  # set under MemKVOffloadingConnector
        self._load_blocks: dict[int, list[int]] = {}  # job id -> GPU blocks, loads in flight
        if self._load_errors is None and self.rank == 0:
            log.warning(
                "memkv-vllm: MemKVOffloadingSpec runs under vLLM's plain OffloadingConnector: "
                "a value that vanishes from MemKV between lookup and load stops the engine. "
                'Use "kv_connector": "MemKVOffloadingConnector", '
                '"kv_connector_module_path": "memkv_vllm.connector" to recompute it'
            )
        log.info(
            "memkv-vllm: direct worker rank %d: %d-byte values, %d blocks per call, %s scratch",
            self.rank, self._slot, self._blocks_per_op, self.medium,
        )  # fmt: skip

    # --- data path (transfer threads) ---------------------------------------------------

    def _copier(self) -> tuple[BlockCopier, np.ndarray]:
        """This part thread's copier and its host rows (registered with the store)."""
        mine = getattr(self._local, "copier", None)
        if mine is None:
            import torch

            rows = torch.empty(
                (self._blocks_per_op, self._slot),
                dtype=torch.int8,
                pin_memory=self._device.type == "cuda",
            )
            raw = rows.numpy()
            self._kv.register(raw)  # zero-copy where the store can
            mine = self._local.copier = (BlockCopier(self._tensors, self._groups, rows), raw)
        return mine

    def _plan(self, keys: list[bytes], block_ids: np.ndarray) -> list[_Planned]:
        ids = [int(b) for b in block_ids]
        if len(ids) != len(keys):
            raise RuntimeError(f"{len(keys)} keys for {len(ids)} GPU blocks")
        plan = []
        for key, block in zip(keys, ids, strict=True):
            group = key_group(key)
            plan.append((direct_key(self.prefix, self.rank, key), group, block))
        return plan

    def _store(
        self, keys: list[bytes], block_ids: np.ndarray, after: torch.cuda.Event | None
    ) -> JobOutcome:
        plan = self._plan(keys, block_ids)
        done = list(
            self._part_pool.map(
                lambda part: self._store_part(part, after), _parts(plan, self._blocks_per_op)
            )
        )
        sent = sum(d.nbytes for d in done)
        failed = sum(len(d.failed_blocks) for d in done)
        self._log_job("store", len(plan), sent, done)
        stalled = [o for d in done for o in d.unavailable]
        if stalled:
            log.warning(
                "memkv-vllm: %d of %d blocks dropped, not stored: member %s timed out or is "
                "down (%s)", len(stalled), len(plan), stalled[0].member, stalled[0].cause,
            )  # fmt: skip
        elif failed:
            log.warning("memkv-vllm: %d of %d blocks were not stored", failed, len(plan))
        return JobOutcome(success=not failed, nbytes=sent)

    def _store_part(self, part: list[_Planned], after: torch.cuda.Event | None) -> _PartDone:
        copier, raw = self._copier()
        started = time.perf_counter()
        copier.gather([(row, group, block) for row, (_, group, block) in enumerate(part)], after)
        copied = time.perf_counter()
        items = [(name, raw[slot], self._value_bytes[group])
                 for slot, (name, group, _) in enumerate(part)]  # fmt: skip
        done = _PartDone(copy_s=copied - started)
        for (_, _, n), (_, _, block), result in zip(
            items, part, self._kv.batch_put(items), strict=True
        ):
            if result.ok:
                done.nbytes += n
            else:
                done.failed_blocks.append(block)
                if result.unavailable:
                    done.unavailable.append(result)
        done.network_s = time.perf_counter() - copied
        return done

    def _load(
        self, keys: list[bytes], block_ids: np.ndarray, after: torch.cuda.Event | None
    ) -> JobOutcome:
        plan = self._plan(keys, block_ids)
        done = list(
            self._part_pool.map(
                lambda part: self._load_part(part, after), _parts(plan, self._blocks_per_op)
            )
        )
        got = sum(d.nbytes for d in done)
        missing = [name for d in done for name in d.missing]
        stalled = [o for d in done for o in d.unavailable]
        failed_blocks = [block for d in done for block in d.failed_blocks]
        self._log_job("load", len(plan), got, done)
        level = logging.ERROR if self._load_errors is None else logging.INFO
        if len(missing) > len(stalled):
            log.log(
                level, "memkv-vllm: %d of %d blocks vanished from the store between lookup "
                "and load (first: %s)", len(missing) - len(stalled), len(plan), missing[0].hex(),
            )  # fmt: skip
        if stalled:
            log.log(
                max(level, logging.WARNING), "memkv-vllm: %d of %d blocks not loaded: member "
                "%s timed out or is down (%s)", len(stalled), len(plan), stalled[0].member,
                stalled[0].cause,
            )  # fmt: skip
        return JobOutcome(success=not missing, failed_keys=failed_blocks, nbytes=got)

    def _load_part(self, part: list[_Planned], after: torch.cuda.Event | None) -> _PartDone:
        copier, raw = self._copier()
        started = time.perf_counter()
        items = [(name, raw[slot], self._value_bytes[group])
                 for slot, (name, group, _) in enumerate(part)]  # fmt: skip
        results = self._kv.batch_get_into(items)
        fetched = time.perf_counter()
        done = _PartDone(network_s=fetched - started)
        present = []
        for slot, ((name, group, block), result) in enumerate(zip(part, results, strict=True)):
            if result:
                present.append((slot, group, block))
                done.nbytes += self._value_bytes[group]
            else:
                done.missing.append(name)
                done.failed_blocks.append(block)
                if result.unavailable:
                    done.unavailable.append(result)
        copier.scatter(present, after)
        done.copy_s = time.perf_counter() - fetched
        return done

    def _log_job(self, kind: str, blocks: int, nbytes: int, parts: list[_PartDone]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "memkv-vllm: direct %s of %d blocks (%d bytes) in %d parts: MemKV %.3f s, "
                "GPU copies %.3f s (summed over parts)", kind, blocks, nbytes, len(parts),
                sum(p.network_s for p in parts), sum(p.copy_s for p in parts),
            )  # fmt: skip

    # --- vLLM's OffloadingWorker --------------------------------------------------------

    # the MemKV side of a transfer is always the `MemKVLoadStoreSpec` our manager built,
    # narrower than vLLM's `LoadStoreSpec`; vLLM 0.33 adds `submit_load(..., expedited=)`
    def submit_store(
        self,
        job_id: int,
        src_spec: GPULoadStoreSpec,
        dst_spec: MemKVLoadStoreSpec,  # type: ignore[override]
    ) -> bool:
        keys, blocks, after = list(dst_spec.keys), src_spec.block_ids, mark(self._device)
        return self._jobs.submit_store(job_id, 0, lambda: self._store(keys, blocks, after))

    def submit_load(  # type: ignore[override]
        self, job_id: int, src_spec: MemKVLoadStoreSpec, dst_spec: GPULoadStoreSpec, **_: Any
    ) -> bool:
        keys, blocks, after = list(src_spec.keys), dst_spec.block_ids, mark(self._device)
        if self._load_errors is not None:
            self._load_blocks[job_id] = [int(b) for b in blocks]
        self._jobs.submit_load(job_id, lambda: self._load(keys, blocks, after))
        return True

    def get_finished(self) -> list[TransferResult]:
        out = []
        for done in self._jobs.finished():
            if "error" in done.extra:
                log.error("memkv-vllm: transfer job %d raised %s", done.job_id, done.extra["error"])
            # stores always "succeed" for vLLM (see the module docstring)
            success = done.outcome.success or not done.is_load
            blocks = self._load_blocks.pop(done.job_id, None) if done.is_load else None
            if not success and blocks is not None and self._load_errors is not None:
                # a job that raised filled an unknown subset: all of its blocks are suspect
                unknown = "error" in done.extra or not done.outcome.failed_keys
                bad = blocks if unknown else list(done.outcome.failed_keys)
                self._load_errors.add_blocks(bad)
                log.warning(
                    "memkv-vllm: load job %d: %d of %d blocks not loaded; vLLM recomputes "
                    "them", done.job_id, len(bad), len(blocks),
                )  # fmt: skip
                success = True
            out.append(
                c.make_transfer_result(done.job_id, success, done.outcome.nbytes, done.seconds)
            )
        return out

    def wait(self, job_ids: set[int]) -> None:
        if not self._jobs.wait_jobs(job_ids, self._cfg.memkv_wait_timeout_s):
            log.error(
                "memkv-vllm: transfers %s still running after %gs (memkv_wait_timeout_s)",
                sorted(job_ids), self._cfg.memkv_wait_timeout_s,
            )  # fmt: skip

    def shutdown(self) -> None:
        self._jobs.drain(timeout=30)
        self._jobs.shutdown()
        self._part_pool.shutdown(wait=True)
        self._kv.close()
