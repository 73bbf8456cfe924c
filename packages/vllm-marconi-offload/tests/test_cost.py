"""The load-or-recompute decision follows the measured rates."""

from __future__ import annotations

from vllm_marconi_offload.cost import PROBE_AFTER_SKIPS, LoadCostModel


class FakeClock:
    """A clock the test advances (the model takes its clock as a parameter)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loads_until_prefill_has_been_measured() -> None:
    model = LoadCostModel(l2_read_bytes_per_s=1.0, prefill_tokens_per_s=0.0)
    assert model.worth_loading(l2_bytes=10**12, tokens=1)


def test_slow_disk_and_fast_prefill_means_recompute() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1.7e9, prefill_tokens_per_s=0.0, clock=clock)
    model.on_step(32_768)
    clock.now += 1.2  # 32k tokens prefilled in 1.2 s (8B model on an H200)
    model.on_step_done()
    assert 27_000 < model.prefill_tokens_per_s < 28_000
    # 4 GiB of KV for those 32k tokens from a 1.7 GB/s disk: 2.5 s > 1.2 s.
    assert not model.worth_loading(l2_bytes=4 << 30, tokens=32_768)
    # The same hit from a fast NVMe array (7 GB/s, measured by a promotion) is worth it.
    model.on_promotion(nbytes=7 << 30, seconds=1.0)
    assert model.worth_loading(l2_bytes=4 << 30, tokens=32_768)


def prefill_measured(model: LoadCostModel, clock: FakeClock, tokens_per_s: float) -> None:
    model.on_step(10_000)
    clock.now += 10_000 / tokens_per_s
    model.on_step_done()


def test_the_first_promotion_replaces_the_assumed_rate() -> None:
    """Measured on CPU vLLM (bench_l2_decision.py): 2 MiB promoted in 90 ms, the same
    2,048 tokens prefilled in 20-33 ms. One promotion is enough to stop loading; the
    assumed 1.5 GB/s used to fade by a fifth per sample and kept every hit loading."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1.5e9, prefill_tokens_per_s=0.0, clock=clock)
    prefill_measured(model, clock, 62_000)
    assert model.worth_loading(l2_bytes=2 << 20, tokens=2048)  # assumed: 1.4 ms < 33 ms
    model.on_promotion(nbytes=2 << 20, seconds=0.09)
    assert not model.worth_loading(l2_bytes=2 << 20, tokens=2048)


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
    for _ in range(10):
        model.on_step(8)  # decode steps
        clock.now += 0.05
        model.on_step_done()
    assert model.prefill_tokens_per_s == 0.0


def test_an_idle_engine_between_steps_is_not_prefill_time() -> None:
    """The step's time runs from its start to its output; the engine then idles until
    the next request (it did in bench_l2_decision.py, and the idle second used to be
    charged to the last prefill, which made recomputing look 10x slower than it is)."""
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    for _ in range(3):
        model.on_step(2048)
        clock.now += 0.02
        model.on_step_done()
        clock.now += 1.0  # idle
    assert 100_000 < model.prefill_tokens_per_s < 105_000


def test_async_scheduling_pairs_each_output_with_its_step() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    model.on_step(4096)  # step 1 starts
    clock.now += 0.01
    model.on_step(8)  # step 2 is scheduled before step 1's output is back
    clock.now += 0.03
    model.on_step_done()  # step 1: 4096 tokens in 40 ms
    model.on_step_done()  # step 2: a decode step, not timed
    assert 100_000 < model.prefill_tokens_per_s < 105_000


def test_a_skipped_tier_is_probed_again() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e6, prefill_tokens_per_s=0.0, clock=clock)
    prefill_measured(model, clock, 100_000)  # 1 MiB from a 1 MB/s disk loses to 512 tokens
    decisions = [model.worth_loading(l2_bytes=1 << 20, tokens=512) for _ in range(40)]
    probes = [i for i, load in enumerate(decisions) if load]
    assert probes == [PROBE_AFTER_SKIPS, 2 * PROBE_AFTER_SKIPS + 1]
