"""One real vLLM engine (CPU build, engine core in this process) for the chaos run.

Usage: python chaos_engine.py SPEC.json. Two modes:

* reference (`SPEC["build"]` = {seed, sessions, turns}): no offload; builds the workload
  (`chaos_workload.build`, one `generate` call per prompt) and writes it to
  `SPEC["workload"]`.
* serve: loads `SPEC["workload"]` and serves it in cycles, one `generate` call per request,
  vLLM's own prefix cache emptied before each call (so every hit comes from the offload
  tier), with `SPEC["kv_transfer_config"]`. `SPEC["calibration_cycles"]` cycles first (the
  run injects no fault then), then it writes the monotonic time to `<folder>/ready` and
  serves until
  `<folder>/stop` exists or `SPEC["max_serve_s"]` has passed. Each call appends one JSON
  line to `<folder>/calls.jsonl` as it ends (flushed: a SIGKILLed engine leaves every call
  it finished): request index, cycle, start and end on the system's monotonic clock
  (comparable across processes), tokens, `num_cached_tokens`, and of the calling thread
  (it runs the model and the connector): `cpu_s` on a CPU and `cpu_wait_s` runnable but
  waiting for a CPU held by other processes (the kernel's schedstat; 0 where it keeps
  none). The rest of a call's time that thread was blocked (sleeping, I/O, page faults),
  or the hypervisor ran other machines' work on this one's CPUs: `steal_s`, the machine's
  steal time over the call (all its CPUs together, 10 ms steps).
  With `SPEC["warmup"]`, one call on a prompt outside the workload comes first (vLLM's
  first call is slow).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools")]

import tiny_model  # noqa: E402
from chaos_workload import BLOCK, REPLY_TOKENS, Workload, build  # noqa: E402

SCHEDSTAT = Path("/proc/thread-self/schedstat")  # cpu ns, run-delay ns, timeslices


def schedstat() -> tuple[float, float]:
    """This thread's total time on a CPU and waiting for one (seconds); 0s where the
    kernel keeps none."""
    try:
        on_cpu, waiting = SCHEDSTAT.read_text().split()[:2]
    except OSError:
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def steal_s() -> float:
    """The machine's steal time so far (seconds, all CPUs), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def make_llm(spec: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    config = spec.get("kv_transfer_config")
    return LLM(
        model=spec["model"], dtype="bfloat16", enforce_eager=True, enable_prefix_caching=True,
        block_size=BLOCK, kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
        max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=4096, seed=0,
        kv_transfer_config=KVTransferConfig(**config) if config else None,
    )  # fmt: skip


def main(spec: dict[str, Any]) -> None:
    from vllm import SamplingParams

    llm = make_llm(spec)
    params = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0, ignore_eos=True)

    def generate(prompt: list[int]) -> Any:
        llm.reset_prefix_cache()
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return out

    workload_path = Path(spec["workload"])
    if "build" in spec:
        b = spec["build"]
        workload = build(b["seed"], b["sessions"], b["turns"], tiny_model.SAFE_VOCAB,
                         lambda prompt: list(generate(prompt).outputs[0].token_ids))  # fmt: skip
        workload.save(workload_path)
        return
    workload = Workload.load(workload_path)
    if spec.get("warmup"):  # vLLM's one-off first-call cost, on a prompt not in the workload
        generate(list(range(10, 10 + 2 * BLOCK + 5)))
    folder = Path(spec["folder"])
    stop = folder / "stop"
    with (folder / "calls.jsonl").open("a") as calls:

        def serve(cycle: int) -> None:
            for index, prompt in enumerate(workload.prompts):
                if stop.exists():
                    return
                (c0, w0), s0, t0 = schedstat(), steal_s(), time.monotonic()
                out = generate(prompt)
                t1, (c1, w1), s1 = time.monotonic(), schedstat(), steal_s()
                record = {"index": index, "cycle": cycle, "t0": t0, "t1": t1,
                          "tokens": list(out.outputs[0].token_ids),
                          "cached": out.num_cached_tokens or 0,
                          "cpu_s": c1 - c0, "cpu_wait_s": w1 - w0,
                          "steal_s": s1 - s0}  # fmt: skip
                calls.write(json.dumps(record) + "\n")
                calls.flush()

        calibration = spec["calibration_cycles"]
        for cycle in range(calibration):
            serve(cycle)
        (folder / "ready").write_text(repr(time.monotonic()))
        deadline = time.monotonic() + spec["max_serve_s"]
        cycle = calibration
        while not stop.exists() and time.monotonic() < deadline:
            serve(cycle)
            cycle += 1
    print("CHAOS ENGINE DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()))
