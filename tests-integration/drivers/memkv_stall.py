"""Phases of greedy generation on one real vLLM engine while a store member is stopped.

Usage: python memkv_stall.py SPEC.json. Like `generate.py` (model, `kv_transfer_config`,
phases of prompts), but the engine core runs in this process so its steps can be timed,
and each phase may signal a store process first: `"signal": ["STOP", pid]` (also `CONT`,
`KILL`), or `"stop_after_hit": [pid, ...]` (SIGSTOP them the moment memkv-vllm's manager
answers a lookup HIT, so the load meets the stopped member). Every prompt is its own `generate`
call. `"until_cached": seconds` repeats a phase (vLLM's prefix cache reset each time,
and the connector's with `"reset_connector": true` at the top) until its first prompt was
served from the store; `"sleep": seconds` waits before the phase's first call. The last
stdout line is `RESULT <json>`:
per phase, each call's tokens, `num_cached_tokens` and seconds, the longest scheduler
step and the longest forward pass, memkv-vllm's lookup calls, and the repeats it took.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process


class Timings:
    """The longest scheduler step and forward pass, and manager lookups, since `reset`."""

    def __init__(self) -> None:
        self.reset()
        self.stop_after_hit: list[int] = []

    def reset(self) -> None:
        self.schedule_s = 0.0
        self.forward_s = 0.0
        self.lookups = 0

    def wrap(self, owner: Any, name: str, field: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                took = time.perf_counter() - started
                setattr(self, field, max(getattr(self, field), took))

        setattr(owner, name, timed)

    def watch_lookups(self, owner: Any) -> None:
        original: Callable[..., Any] = owner.lookup

        def lookup(manager: Any, *args: Any, **kwargs: Any) -> Any:
            self.lookups += 1
            result = original(manager, *args, **kwargs)
            if self.stop_after_hit and result.name == "HIT":
                for pid in self.stop_after_hit:
                    os.kill(pid, signal.SIGSTOP)
                self.stop_after_hit = []
            return result

        owner.lookup = lookup


def instrument() -> Timings:
    from memkv_vllm.direct_manager import MemKVDirectManager
    from memkv_vllm.tier import MemKVTierManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_worker import Worker

    timings = Timings()
    timings.wrap(Scheduler, "schedule", "schedule_s")
    timings.wrap(Worker, "execute_model", "forward_s")
    timings.watch_lookups(MemKVDirectManager)
    timings.watch_lookups(MemKVTierManager)
    return timings


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    timings = instrument()
    llm = LLM(
        model=spec["model"], dtype="bfloat16", enforce_eager=True, enable_prefix_caching=True,
        block_size=32, kv_cache_memory_bytes=spec.get("kv_cache_memory_bytes", 16 << 20),
        max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=4096, seed=0,
        kv_transfer_config=KVTransferConfig(**spec["kv_transfer_config"]),
    )  # fmt: skip
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    results = []
    for index, phase in enumerate(spec["phases"]):
        if "signal" in phase:
            name, pid = phase["signal"]
            os.kill(pid, getattr(signal, f"SIG{name}"))
        timings.stop_after_hit = list(phase.get("stop_after_hit", []))
        time.sleep(phase.get("sleep", 0))
        started, repeats = time.monotonic(), 0
        while True:
            timings.reset()
            repeats += 1
            llm.reset_prefix_cache(reset_connector=bool(spec.get("reset_connector")))
            calls = []
            for ids in phase["prompts"]:
                t0 = time.perf_counter()
                (out,) = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
                calls.append({"tokens": list(out.outputs[0].token_ids),
                              "cached": out.num_cached_tokens or 0,
                              "seconds": time.perf_counter() - t0})  # fmt: skip
            limit = phase.get("until_cached")
            if limit is None or calls[0]["cached"] or time.monotonic() - started > limit:
                break
            time.sleep(0.1)
        result = {"calls": calls, "schedule_s": timings.schedule_s, "lookups": timings.lookups,
                  "forward_s": timings.forward_s, "repeats": repeats,
                  "seconds": time.monotonic() - started}  # fmt: skip
        print(f"PHASE {index} {json.dumps({k: v for k, v in result.items() if k != 'calls'})} "
              f"calls={[(c['cached'], round(c['seconds'], 3)) for c in calls]}", flush=True)  # fmt: skip
        results.append(result)
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    print("RESULT " + json.dumps(run(spec)), flush=True)
