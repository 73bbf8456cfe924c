"""What the eviction policy costs vLLM's scheduler step: `auto` against `lru`, per L1 size.

vLLM's real `Scheduler` with the connector in both roles and no model (the engine loop of
`tests-integration/engine_loop.py`, its forward pass replaced by one that only samples):
the time measured is `Scheduler.schedule()` plus `Scheduler.update_from_output()`, which
include every scheduler-side connector call (lookups and pins of hits, slot allocation
and eviction for stores, commits). The model, the workers' copies and the KV tensors are
not in it; they cost the same under both policies. The policy's share of the step is
largest here, with no model time to hide it.

Workload: prompts of 3,968 tokens (248 blocks of 16), each sharing a prefix of 0-100%
(uniform) with one of the last 64 prompts, the rest new; 8 requests at a time, 8,192
tokens per step (chunked prefill), so each step stores about 500 blocks, hits touch hot
blocks and, once the L1 is full, every step evicts. vLLM's own prefix cache holds 4,096
GPU blocks. Per-step cost is CPU time, so other load on the shared machine does not
count directly, measured two ways: the scheduler thread's own (`thread`: what the
scheduler and the policy compute) and the whole process's (`process`: also what the
process's other threads, torch's copy workers and the pool's I/O threads, burn while the
scheduler runs; that grows with the blocks a step loads, i.e. with the hit rate, which
is why each run also reports the prompt tokens served from cache). A run first fills the
L1 twice over (not timed), then times `--steps` steps; the policies run interleaved
`--rounds` times and per policy the fastest round's median step counts. Each run has a fresh process: in one process a
later run is slower than an earlier one of the same policy (lru's second run took
12.96 against 9.50 ms per step), which favoured whichever policy ran first; the order of
the policies alternates from round to round. Besides the ratio of the fastest rounds, the
table gives the median and range of the per-round ratios (each round's runs follow each
other, so load that drifts over minutes cancels).

`--base DIR` compares code versions in one run: a policy written `NAME@base` is built from
the kv_eviction package folder DIR (say, main's `packages/kv-eviction/src/kv_eviction` in
another worktree), imported under another name, so old and new code run interleaved
(`--policies lru,auto@base,auto`).

`--record DIR` also writes each run's L1 policy calls (fill and timed steps, in order) to
DIR for `replay_eviction_calls.py`, which times the policy alone on them; the calls go
through a recording wrapper then, so the step times of such a run are not comparable.
A recording replays only under the PYTHONHASHSEED it was made with (the connector's keys
are `bytes`, and `auto` samples them by hash).

    python bench_eviction_step.py [--blocks 4096,65536] [--steps 60] [--rounds 3] [--base DIR] [--record DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import pickle
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Hashable
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from kv_eviction import EvictionPolicy, PolicyStats, make_policy, register_policy
from kv_eviction.retention import Retention

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests-integration"), str(ROOT / "tools")]

import tiny_model  # noqa: E402
from engine_loop import EngineLoop  # noqa: E402

BLOCK = 16
PROMPT_BLOCKS = 248
SLOT_BYTES = 2 * 2 * BLOCK * 2 * 16 * 2  # layers x (K, V) x tokens x heads x dims x bf16
HISTORY = 64
BASE = "kv_eviction_base"
"""The module name `--base`'s package is imported under."""
CALLS: list[tuple[Any, ...]] = []
"""The recorded calls of every `RecordingPolicy` of this process, in order, and markers."""


class RecordingPolicy(EvictionPolicy):
    """A registered policy that appends every call to `CALLS` (tagged with its instance)."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.tag = sum(1 for call in CALLS if call[0] == "new")
        CALLS.append(("new", self.tag))

    def _call(self, name: str, *args: Any) -> None:
        CALLS.append((self.tag, name, *args))
        getattr(self.policy, name)(*args)

    def insert(
        self,
        key: Hashable,
        parent: Hashable | None = None,
        depth: int = 0,
        retention: Retention = Retention.NORMAL,
    ) -> None:
        if retention == Retention.NORMAL:  # replayable on a base without retention
            self._call("insert", key, parent, depth)
        else:
            self._call("insert", key, parent, depth, retention)

    def touch(self, key: Hashable) -> None:
        self._call("touch", key)

    def remove(self, key: Hashable) -> None:
        self._call("remove", key)

    def pin(self, key: Hashable) -> None:
        self._call("pin", key)

    def unpin(self, key: Hashable) -> None:
        self._call("unpin", key)

    def pop_victims(self, n: int) -> list[Hashable]:
        victims = self.policy.pop_victims(n)
        CALLS.append((self.tag, "pop_victims", n, len(victims)))
        return victims

    def tick(self, n: int = 1) -> None:
        self._call("tick", n)

    def __len__(self) -> int:
        return len(self.policy)

    def __contains__(self, key: object) -> bool:
        return key in self.policy

    def stats(self) -> PolicyStats:
        return self.policy.stats()


class TimedLoop(EngineLoop):
    """The engine loop with a forward pass that only samples, and the scheduler timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0
        self.thread_seconds = 0.0
        for name in ("schedule", "update_from_output"):
            setattr(self.scheduler, name, self._timed(getattr(self.scheduler, name)))

    def _timed(self, method: Any) -> Any:
        def timed(*args: Any) -> Any:
            t0, thread_t0 = time.process_time(), time.thread_time()
            try:
                return method(*args)
            finally:
                self.seconds += time.process_time() - t0
                self.thread_seconds += time.thread_time() - thread_t0

        return timed

    def _forward(self, out: Any) -> dict[str, list[int]]:
        from vllm_marconi_offload import compat

        starts = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        for new in out.scheduled_new_reqs:
            self._cached.setdefault(new.req_id, new.num_computed_tokens)
        for req_id, _, computed, _ in compat.cached_requests(out):
            starts[req_id] = computed
        sampled: dict[str, list[int]] = {}
        for req_id, count in out.num_scheduled_tokens.items():
            if starts[req_id] + count >= self._requests[req_id].num_tokens:
                sampled[req_id] = [1]
        return sampled


def _prompts(rng: random.Random, count: int, history: list[list[int]]) -> list[list[int]]:
    out = []
    for _ in range(count):
        shared: list[int] = []
        if history:
            base = rng.choice(history)
            shared = base[: int(len(base) * rng.random()) // BLOCK * BLOCK]
        tokens = shared + [
            rng.randrange(1, 500) for _ in range(PROMPT_BLOCKS * BLOCK - len(shared))
        ]
        history[:] = [*history[-HISTORY + 1 :], tokens]
        out.append(tokens)
    return out


def parse_policy(spec: str) -> tuple[str, dict[str, Any]]:
    """`name` or `name:option=value:...` (numbers as numbers) -> name and options."""
    name, *pairs = spec.split(":")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        options[key] = value
    return name, options


def load_base(folder: str) -> ModuleType:
    """The kv_eviction package in `folder`, imported (once) as `BASE`."""
    if BASE not in sys.modules:
        init = Path(folder) / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            BASE, init, submodule_search_locations=[folder]
        )
        if spec is None or spec.loader is None or not init.is_file():
            raise SystemExit(f"--base {folder}: not a kv_eviction package folder")
        sys.modules[BASE] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "ENTRY_POINT_GROUP"):
            # its built-ins are entry points naming the installed `kv_eviction`: use its own
            for entry in entry_points(group=module.ENTRY_POINT_GROUP):
                if entry.module.startswith("kv_eviction."):
                    own = importlib.import_module(BASE + entry.module.removeprefix("kv_eviction"))
                    module.register_policy(entry.name, getattr(own, entry.attr))
    return sys.modules[BASE]


def register_base(name: str, base: str) -> None:
    """Make `NAME@base` a policy (built from `--base`'s package) for `make_policy`."""
    if name.endswith("@base"):
        stem = name.removesuffix("@base")
        register_policy(name, lambda **o: load_base(base).make_policy(stem, **o))


class Cost(NamedTuple):
    """One run: median CPU seconds of `schedule()` + `update_from_output()` per step, of
    the process and of the scheduler's thread; mean prompt tokens served from cache."""

    process: float
    thread: float
    cached_tokens: float


def measure(
    model: str, policy: str, blocks: int, steps: int, seed: int, record: str = "", base: str = ""
) -> Cost:
    """One run of `steps` timed steps (see the module docstring); with `record`, the L1
    policy's calls are written to that file; `base` is `--base`."""
    rng = random.Random(seed)
    history: list[list[int]] = []
    name, options = parse_policy(policy)
    register_base(name, base)
    if record:
        recorded = name
        name = f"recorded-{name}"
        register_policy(name, lambda **o: RecordingPolicy(make_policy(recorded, **o)))
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        loop = TimedLoop(
            model,
            {
                "cpu_pool_path": tmp,
                "cpu_bytes_to_use": blocks * SLOT_BYTES,
                "eviction_policy": name,
                "eviction_options": options,
            },
            block_size=BLOCK,
            num_blocks=4096,
            max_num_batched_tokens=8192,
        )
        try:
            new_blocks_per_batch = 8 * PROMPT_BLOCKS // 2  # half of each prompt is new
            for _ in range(2 * blocks // new_blocks_per_batch + 2):  # fill the L1 twice
                loop.generate(_prompts(rng, 8, history), max_tokens=1)
            costs: list[float] = []
            thread_costs: list[float] = []
            cached: list[int] = []
            CALLS.append(("timed",))
            while len(costs) < steps:
                batch = loop.submit(_prompts(rng, 8, history), max_tokens=1)
                finished = 0
                while finished < len(batch):
                    CALLS.append(("step",))
                    loop.seconds = loop.thread_seconds = 0.0
                    done = loop.step()
                    finished += len(done)
                    cached += [tokens for _, tokens in done]
                    costs.append(loop.seconds)
                    thread_costs.append(loop.thread_seconds)
        finally:
            loop.shutdown()
    if record:
        with open(record, "wb") as out:
            pickle.dump({"policy": policy, "probe": hash(b"probe"), "calls": CALLS}, out)
    return Cost(statistics.median(costs), statistics.median(thread_costs), statistics.mean(cached))


def measure_alone(
    model: str, policy: str, blocks: int, steps: int, seed: int, record: str = "", base: str = ""
) -> Cost:
    """`measure` in a fresh process (spawned: no state of earlier runs)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(measure, model, policy, blocks, steps, seed, record, base).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="4096,65536", help="L1 sizes in blocks")
    parser.add_argument(
        "--policies",
        default="lru,auto",
        help="comma-separated; options as auto:switch_margin=0.99; ratios are to the first",
    )
    parser.add_argument("--steps", type=int, default=60, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--record", default="", help="folder for the policies' calls")
    parser.add_argument("--base", default="", help="kv_eviction package folder for NAME@base")
    args = parser.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-model-") as models:
        model = str(tiny_model.build(Path(models) / "tiny-llama", "llama"))
        others = policies[1:]
        print(
            "| L1 blocks | CPU of | "
            + " | ".join(f"{p} ms/step" for p in policies)
            + "".join(f" | {p} / {policies[0]} | per round: median [range]" for p in others)
            + " | cached tokens per prompt |"
        )
        print("|---:|---|" + "---:|" * (len(policies) + 2 * len(others) + 1))
        for blocks in (int(float(b)) for b in args.blocks.split(",")):
            runs: dict[str, list[Cost]] = {p: [] for p in policies}
            for round_ in range(args.rounds):
                order = policies if round_ % 2 == 0 else policies[::-1]
                for policy in order:
                    record = ""
                    if args.record:
                        label = policy.replace(":", "-").replace("=", "").replace("@", "-")
                        record = str(Path(args.record) / f"{label}-{blocks}-{round_}.pkl")
                    cost = measure_alone(
                        model, policy, blocks, args.steps, args.seed, record, args.base
                    )
                    runs[policy].append(cost)
            cached = " / ".join(
                f"{statistics.mean(run.cached_tokens for run in runs[p]):,.0f}" for p in policies
            )
            for field in ("thread", "process"):
                best = {p: min(getattr(run, field) for run in runs[p]) for p in policies}
                cells = [f"{1e3 * best[p]:.2f}" for p in policies]
                for other in others:
                    pairs = zip(runs[policies[0]], runs[other], strict=True)
                    paired = [getattr(b, field) / getattr(a, field) for a, b in pairs]
                    cells.append(f"{best[other] / best[policies[0]]:.2f}x")
                    cells.append(
                        f"{statistics.median(paired):.2f}x [{min(paired):.2f}-{max(paired):.2f}]"
                    )
                print(f"| {blocks:,} | {field} | {' | '.join(cells)} | {cached} |", flush=True)


if __name__ == "__main__":
    main()
