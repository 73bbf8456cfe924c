"""The load-or-recompute decision follows the measured rates."""

from __future__ import annotations

from pathlib import Path

from kvpool_mmap import LoadStatus, LoadTicket, StoreConfig, Tier, TierConfig, TieredStore
from vllm_marconi_offload.cost import PROBE_AFTER_SKIPS, PROBE_BUDGET, LoadCostModel


class FakeClock:
    """A clock the test advances (the model takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loads_until_prefill_has_been_measured() -> None:
    model = LoadCostModel(l2_read_bytes_per_s=1.0, prefill_tokens_per_s=0.0)
    assert model.blocks_to_load(blocks=1, l2_bytes=10**12, tokens=1) == 1


def test_slow_disk_and_fast_prefill_means_recompute() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1.7e9, prefill_tokens_per_s=0.0, clock=clock)
    model.on_step(1, 32_768)
    clock.now += 1.2  # 32k tokens prefilled in 1.2 s (8B model on an H200)
    model.on_step_done(1)
    assert 27_000 < model.prefill_tokens_per_s < 28_000
    # 4 GiB of KV for those 32k tokens from a 1.7 GB/s disk: 2.5 s > 1.2 s.
    assert model.blocks_to_load(blocks=2048, l2_bytes=4 << 30, tokens=32_768) == 0
    # The same hit from a fast NVMe array (7 GB/s, measured by a promotion) is worth it.
    model.on_promotion(nbytes=7 << 30, seconds=1.0)
    assert model.blocks_to_load(blocks=2048, l2_bytes=4 << 30, tokens=32_768) == 2048


def prefill_measured(model: LoadCostModel, clock: FakeClock, tokens_per_s: float) -> None:
    model.on_step(1, 10_000)
    clock.now += 10_000 / tokens_per_s
    model.on_step_done(1)


def test_the_first_promotion_replaces_the_assumed_rate() -> None:
    """One measured promotion replaces the assumed rate at once, so a disk slower than
    prefill stops the loading after its first promotion (rates as on CPU vLLM)."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1.5e9, prefill_tokens_per_s=0.0, clock=clock)
    prefill_measured(model, clock, 62_000)
    # assumed: 1.4 ms < 33 ms
    assert model.blocks_to_load(blocks=64, l2_bytes=2 << 20, tokens=2048) == 64
    model.on_promotion(nbytes=2 << 20, seconds=0.09)
    assert model.blocks_to_load(blocks=64, l2_bytes=2 << 20, tokens=2048) == 0


def test_slow_promotions_are_not_hidden_by_fast_ones() -> None:
    """The time per byte is averaged, not the rate: alternating 1 GB/s and 10 MB/s reads
    take 50 ms per MB on average, so the estimate must be near 20 MB/s, not 500 MB/s."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    for _ in range(20):
        model.on_promotion(nbytes=10**6, seconds=0.001)
        model.on_promotion(nbytes=10**6, seconds=0.1)
    assert 10e6 < model.l2_bytes_per_s < 40e6


def test_small_steps_do_not_count_as_prefill() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    for step in range(10):
        model.on_step(step, 8)  # decode steps
        clock.now += 0.05
        model.on_step_done(step)
    assert model.prefill_tokens_per_s == 0.0


def test_an_idle_engine_between_steps_is_not_prefill_time() -> None:
    """The step's time runs from its start to its output; the idle time until the next
    request is not charged to the last prefill."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    for step in range(3):
        model.on_step(step, 2048)
        clock.now += 0.02
        model.on_step_done(step)
        clock.now += 1.0  # idle
    assert 100_000 < model.prefill_tokens_per_s < 105_000


def test_each_report_times_the_step_it_names() -> None:
    """Under async scheduling step 2 starts before step 1's report; steps with no tokens
    (a request waiting for its promotion) may never run, so never report."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    model.on_step(0, 0)  # nothing to run: no report comes
    model.on_step(1, 4096)
    clock.now += 0.01
    model.on_step(2, 4096)  # scheduled before step 1's report is back
    clock.now += 0.03
    model.on_step_done(1)  # step 1: 4096 tokens in 40 ms
    assert 100_000 < model.prefill_tokens_per_s < 105_000
    clock.now += 5.0  # step 2's report is lost; the engine idles
    model.on_step(3, 4096)
    clock.now += 0.04
    model.on_step_done(3)  # step 2 is forgotten, not timed at 5 s
    assert 100_000 < model.prefill_tokens_per_s < 105_000


def test_a_skipped_tier_is_probed_again() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e6, prefill_tokens_per_s=0.0, clock=clock)
    prefill_measured(model, clock, 100_000)  # 1 MiB from a 1 MB/s disk loses to 512 tokens
    decisions = [model.blocks_to_load(blocks=16, l2_bytes=1 << 20, tokens=512) for _ in range(40)]
    probes = [i for i, load in enumerate(decisions) if load]
    assert probes == [PROBE_AFTER_SKIPS, 2 * PROBE_AFTER_SKIPS + 1]


def test_a_probe_loads_only_what_the_budget_allows() -> None:
    """A probe of a long L2 hit loads only the blocks its budget allows, not the hit."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=0.8e9, prefill_tokens_per_s=0.0, clock=clock)
    prefill_measured(model, clock, 27_000)
    blocks, block_bytes, block_tokens = 2047, 2 << 20, 16
    hit = {"blocks": blocks, "l2_bytes": blocks * block_bytes, "tokens": blocks * block_tokens}
    for _ in range(PROBE_AFTER_SKIPS):
        assert model.blocks_to_load(**hit) == 0
    probe = model.blocks_to_load(**hit)
    assert 1 <= probe < blocks // 10
    load = probe * block_bytes / 0.8e9
    recompute = probe * block_tokens / model.prefill_tokens_per_s
    whole_recompute = hit["tokens"] / model.prefill_tokens_per_s
    assert load - recompute <= PROBE_BUDGET * whole_recompute * 1.01
    assert model.blocks_to_load(**hit) == 0  # the probe restarts the count of skips


def test_a_chunk_scheduled_while_the_previous_runs_is_timed_from_that_ones_report() -> None:
    """Async scheduling schedules a 32k prompt's second 16k chunk while the first runs;
    that chunk is timed from the first one's report, not from its scheduling (which would
    count both chunks and make prefill look slower than reading L2)."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1.5e9, prefill_tokens_per_s=0.0, clock=clock)
    for first, second in ((1, 2), (3, 4)):
        model.on_step(first, 16_384)
        clock.now += 0.001
        model.on_step(second, 16_384)  # scheduled while `first` runs
        clock.now += 0.6
        model.on_step_done(first)
        clock.now += 0.6
        model.on_step_done(second)
        clock.now += 2.0  # idle until the next prompt
    assert 26_000 < model.prefill_tokens_per_s < 28_000
    blocks = 1_804  # run F's 32k L2 hit: 3.8 GB at 1.5 GB/s against 28,864 tokens
    assert model.blocks_to_load(blocks, blocks * (2 << 20), blocks * 16) == 0


def promote(store: TieredStore, keys: list[bytes]) -> LoadTicket:
    """Push `keys` out of the 4-slot L1 (eight new blocks), then load them back from L2."""
    store.put([bytes([0xF0, i]) + bytes(14) for i in range(8)], [[0] * 4096] * 8)
    ticket = store.begin_load(keys)
    assert ticket.tiers == [Tier.L2] * len(keys)
    assert store.wait_load(ticket, 10) is LoadStatus.READY
    store.end_load(ticket)
    return ticket


def test_promotions_from_the_page_cache_teach_nothing(tmp_path: Path) -> None:
    """A buffered L2 serves blocks written or read moments before from the page cache, at
    memory speed; learning that rate made the rule load hits the disk then served slowly.
    Only blocks read from the disk (after the cache was dropped) teach the model."""
    store = TieredStore(
        StoreConfig(
            stride=4096,
            engine_id="cost",
            fingerprint=b"cost",
            l1=TierConfig(tmp_path / "l1", 4 * 4096),
            l2=TierConfig(tmp_path / "l2", 1 << 20),
            direct_io="off",
            l2_fsync="never",  # the page cache is dropped only by flush() here
        )
    )
    model = LoadCostModel(l2_read_bytes_per_s=1.0, prefill_tokens_per_s=0.0)
    keys = [bytes([i]) * 16 for i in range(4)]
    try:
        store.put(keys, [[i] * 4096 for i in range(4)])
        store.flush()  # written to L2, then its cached pages dropped
        from_disk = promote(store, keys)
        assert from_disk.cached_promotions == 0
        model.on_promotions([from_disk], slot_bytes=4096)
        learned = model.l2_bytes_per_s
        assert learned > 1.0  # measured: the assumed 1 B/s is gone
        from_cache = promote(store, keys)  # read a moment ago: still in the page cache
        assert from_cache.cached_promotions == 4
        assert from_cache.promotion_seconds > 0
        model.on_promotions([from_cache], slot_bytes=4096)
        assert model.l2_bytes_per_s == learned
    finally:
        store.close()
