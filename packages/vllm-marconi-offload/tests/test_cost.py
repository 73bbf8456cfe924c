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
    model.on_step(0)
    assert 27_000 < model.prefill_tokens_per_s < 28_000
    # 4 GiB of KV for those 32k tokens from a 1.7 GB/s disk: 2.5 s > 1.2 s.
    assert not model.worth_loading(l2_bytes=4 << 30, tokens=32_768)
    # The same hit from a fast NVMe array (7 GB/s, measured by promotions) is worth it.
    model.on_promotion(nbytes=7 << 30, seconds=1.0)
    for _ in range(20):
        model.on_promotion(nbytes=7 << 30, seconds=1.0)
    assert model.worth_loading(l2_bytes=4 << 30, tokens=32_768)


def test_small_steps_do_not_count_as_prefill() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e9, prefill_tokens_per_s=0.0, clock=clock)
    for _ in range(10):
        model.on_step(8)  # decode steps
        clock.now += 0.05
    assert model.prefill_tokens_per_s == 0.0


def test_a_skipped_tier_is_probed_again() -> None:
    clock = FakeClock()
    model = LoadCostModel(l2_read_bytes_per_s=1e6, prefill_tokens_per_s=0.0, clock=clock)
    model.on_step(10_000)
    clock.now += 0.1
    model.on_step(0)  # 100k tokens/s: 1 MiB from a 1 MB/s disk loses to 512 tokens
    decisions = [model.worth_loading(l2_bytes=1 << 20, tokens=512) for _ in range(40)]
    probes = [i for i, load in enumerate(decisions) if load]
    assert probes == [PROBE_AFTER_SKIPS, 2 * PROBE_AFTER_SKIPS + 1]
