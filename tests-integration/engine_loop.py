"""vLLM's real scheduler and our real connector (both roles), with a model-free forward pass.

For vLLM releases we cannot run end to end here (0.33 has no CPU build; its GPU wheel still
imports on a CPU machine), this drives the same calls an engine step makes:
`Scheduler.schedule()`, the worker connector's `start_load_kv` / `wait_for_save` /
`get_finished` / `build_connector_worker_meta`, and `Scheduler.update_from_output()`.

The "forward pass" writes, for every computed token, a value derived from the token and
the whole prefix before it into that token's KV slot (as real KV depends on the prefix),
and before computing a new request it checks every token vLLM says is already computed:
whatever the connector loaded must be exactly what the forward pass would have written.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Sequence
from typing import Any

import torch

NUM_LAYERS = 2
KV_HEADS = 2
HEAD_SIZE = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_single_rank() -> None:
    """A one-process tensor-parallel group, as a worker process has (gloo, CPU)."""
    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    parallel_state.init_distributed_environment(
        world_size=1,
        rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        local_rank=0,
        backend="gloo",
    )
    parallel_state.initialize_model_parallel(1, 1)


def _build(cls: type, **kwargs: Any) -> Any:
    """cls(**kwargs) keeping only the arguments this vLLM release's constructor takes."""
    names = set(inspect.signature(cls).parameters)
    return cls(**{k: v for k, v in kwargs.items() if k in names})


class EngineLoop:
    """One engine: scheduler, worker connector and CPU KV tensors; see the module docstring."""

    def __init__(
        self,
        model: str,
        extra_config: dict[str, Any],
        *,
        block_size: int = 16,
        num_blocks: int = 64,
        max_num_batched_tokens: int = 1024,
    ) -> None:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )

        self.block_size = block_size
        model_config = ModelConfig(model=model, dtype="bfloat16", seed=0, skip_tokenizer_init=True)
        scheduler_config = _build(
            SchedulerConfig,
            max_num_seqs=8,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=4096,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=True)
        cache_config.num_gpu_blocks = num_blocks
        kv_transfer_config = KVTransferConfig(
            kv_connector="MarconiOffloadConnector",
            kv_connector_module_path="vllm_marconi_offload",
            kv_role="kv_both",
            kv_connector_extra_config={"hit_log_interval": 1, **extra_config},
        )
        self.vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            kv_transfer_config=kv_transfer_config,
            device_config=DeviceConfig("cpu"),
        )
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]
        spec = _build(
            FullAttentionSpec,
            block_size=block_size,
            num_kv_heads=KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.bfloat16,
            use_mla=False,
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],  # how a model runner allocates; we allocate below
            kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
        )
        # The worker registers its caches first (the engine does this before it builds the
        # scheduler): that creates the L1 file the scheduler's store attaches to.
        with set_current_vllm_config(self.vllm_config):
            init_single_rank()
            self._start(kv_cache_config, layers, num_blocks)
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)  # once per process, as the engine does
        self._hasher = get_request_block_hasher(block_size, sha256)
        self._block_ids: dict[str, list[int]] = {}
        self._cached: dict[str, int] = {}
        """Tokens each request had computed when first scheduled (vLLM's cache or ours)."""
        self._requests: dict[str, Any] = {}
        self._ids = 0
        self.checked_tokens = 0
        """Tokens vLLM reported as already computed whose KV this loop verified."""

    def _start(self, kv_cache_config: Any, layers: list[str], num_blocks: int) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm_marconi_offload import MarconiOffloadConnector

        self.kv = {
            name: torch.zeros(
                num_blocks, 2, self.block_size, KV_HEADS, HEAD_SIZE, dtype=torch.bfloat16
            )
            for name in layers
        }
        self.worker = MarconiOffloadConnector(
            self.vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
        self.worker.register_kv_caches(self.kv)
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=self.block_size,
            log_stats=True,
        )

    # -- requests --------------------------------------------------------------------------
    def submit(self, prompts: Sequence[list[int]], max_tokens: int = 4) -> list[str]:
        """Add `prompts` to the scheduler (greedy, `max_tokens` each); their request ids."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        ids = []
        for prompt in prompts:
            self._ids += 1
            req_id = f"req-{self._ids}"
            request = _build(
                Request,
                request_id=req_id,
                prompt_token_ids=list(prompt),
                sampling_params=params,
                pooling_params=None,
                eos_token_id=None,
                block_hasher=self._hasher,
            )
            self._requests[req_id] = request
            self.scheduler.add_request(request)
            ids.append(req_id)
        return ids

    def generate(self, prompts: Sequence[list[int]], max_tokens: int = 4) -> list[dict[str, Any]]:
        """Run `prompts` to completion; per prompt its output tokens and cached tokens."""
        ids = self.submit(prompts, max_tokens)
        results: dict[str, dict[str, Any]] = {}
        for _ in range(1000):
            if all(req_id in results for req_id in ids):
                break
            for req_id, cached in self.step():
                request = self._requests.pop(req_id)
                results[req_id] = {"tokens": list(request.output_token_ids), "cached": cached}
        else:
            raise AssertionError("requests did not finish in 1000 steps")
        return [results[req_id] for req_id in ids]

    def reset_prefix_cache(self) -> None:
        assert self.scheduler.reset_prefix_cache()

    # -- one engine step -------------------------------------------------------------------
    def step(self) -> list[tuple[str, int]]:
        """Schedule, load, compute, store, report; the requests that finished (with their
        cached-token counts)."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        out = self.scheduler.schedule()
        self.worker.bind_connector_metadata(out.kv_connector_metadata)
        self.worker.start_load_kv(None)
        sampled = self._forward(out)
        self.worker.wait_for_save()
        _, finished_recving = self.worker.get_finished(out.finished_req_ids)
        worker_meta = self.worker.build_connector_worker_meta()
        self.worker.clear_connector_metadata()
        order = list(out.num_scheduled_tokens)
        runner_output = _build(
            ModelRunnerOutput,
            req_ids=order,
            req_id_to_index={req_id: i for i, req_id in enumerate(order)},
            sampled_token_ids=[sampled.get(req_id, []) for req_id in order],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=_build(
                KVConnectorOutput,
                finished_sending=None,
                finished_recving=finished_recving,
                kv_connector_worker_meta=worker_meta,
            ),
        )
        finished = []
        engine_outputs = self.scheduler.update_from_output(out, runner_output)
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    finished.append((output.request_id, self._cached.pop(output.request_id)))
        return finished

    def _forward(self, out: Any) -> dict[str, list[int]]:
        from vllm_marconi_offload import compat

        sampled: dict[str, list[int]] = {}
        starts: dict[str, int] = {}
        for new in out.scheduled_new_reqs:
            self._block_ids[new.req_id] = list(new.block_ids[0])
            starts[new.req_id] = new.num_computed_tokens
            self._cached.setdefault(new.req_id, new.num_computed_tokens)
        for req_id, new_ids, computed, resumed in compat.cached_requests(out):
            if resumed:
                self._block_ids[req_id] = list(new_ids[0]) if new_ids else []
            elif new_ids:
                self._block_ids[req_id].extend(new_ids[0])
            starts[req_id] = computed
        for req_id, count in out.num_scheduled_tokens.items():
            request = self._requests[req_id]
            start = starts[req_id]
            tokens = request.all_token_ids
            for position in range(start, start + count):
                self._write(req_id, position, _kv_value(tokens, position))
            if start + count >= request.num_tokens:
                sampled[req_id] = [_next_token(tokens)]
        # Everything vLLM counts as computed (its own cache or our load) must be right. Checked
        # after this step's writes: a prefix hit on blocks another request computes in the
        # same step is legal (a real forward writes each layer's KV before attending).
        for new in out.scheduled_new_reqs:
            self._check(new.req_id, new.num_computed_tokens)
        return sampled

    def _slot(self, req_id: str, position: int) -> tuple[int, int]:
        return self._block_ids[req_id][position // self.block_size], position % self.block_size

    def _write(self, req_id: str, position: int, value: float) -> None:
        block, offset = self._slot(req_id, position)
        for layer, tensor in enumerate(self.kv.values()):
            tensor[block, :, offset] = value + layer

    def _check(self, req_id: str, computed: int) -> None:
        tokens = self._requests[req_id].all_token_ids
        for position in range(computed):
            block, offset = self._slot(req_id, position)
            want = _kv_value(tokens, position)
            for layer, tensor in enumerate(self.kv.values()):
                got = tensor[block, :, offset]
                assert torch.all(got == want + layer), (
                    f"{req_id}: KV of token {position} (block {block}) is not what computing "
                    f"it gives: {got.flatten()[:4].tolist()} != {want + layer}"
                )
        self.checked_tokens += computed

    def shutdown(self) -> None:
        connector = self.scheduler.connector
        if connector is not None:
            connector.shutdown()
        self.worker.shutdown()


def _kv_value(tokens: Sequence[int], position: int) -> float:
    """A stand-in for a token's KV: depends on the token and everything before it
    (a small integer, exact in bfloat16)."""
    return float(hash(tuple(tokens[: position + 1])) % 97)


def _next_token(tokens: Sequence[int]) -> int:
    return sum(tokens) % 500 + 1
