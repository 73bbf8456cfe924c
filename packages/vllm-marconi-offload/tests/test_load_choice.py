"""`load_mode: auto` keeps the faster same-step load path, with a margin for the layer-wise
path's overlap with the forward, and says so in one line."""

from __future__ import annotations

import pytest
from vllm_marconi_offload.config import ConfigError, OffloadConfig
from vllm_marconi_offload.load_choice import LoadRates, auto_line, choose_load_mode

GB = 1e9


def test_auto_is_the_default_and_a_fixed_mode_stays_settable() -> None:
    assert OffloadConfig.from_extra_config({}).load_mode == "auto"
    for mode in ("async", "same_step", "layer_wise"):
        assert OffloadConfig.from_extra_config({"load_mode": mode}).load_mode == mode
    with pytest.raises(ConfigError, match=r"load_mode must be one of \['auto', 'async'"):
        OffloadConfig.from_extra_config({"load_mode": "fastest"})


@pytest.mark.parametrize(
    ("layer_wise", "same_step", "expected"),
    [
        (30 * GB, 20 * GB, "layer_wise"),  # faster
        (25 * GB, 25 * GB, "layer_wise"),  # a tie: layer_wise overlaps the forward
        (48.7 * GB, 53.7 * GB, "layer_wise"),  # H200: 9% slower raw, 14% faster hits
        (85 * GB, 100 * GB, "layer_wise"),  # at the margin
        (84 * GB, 100 * GB, "same_step"),  # past it
        (30 * GB, 45 * GB, "same_step"),  # an H100 host whose PCIe reads are slow
    ],
)
def test_the_faster_path_is_kept_with_a_margin_for_layer_wise(
    layer_wise: float, same_step: float, expected: str
) -> None:
    assert choose_load_mode(LoadRates(layer_wise, same_step)) == expected


def test_a_path_that_does_not_exist_is_never_chosen() -> None:
    assert choose_load_mode(LoadRates(None, 20 * GB)) == "same_step"
    assert choose_load_mode(LoadRates(20 * GB, None)) == "layer_wise"
    assert choose_load_mode(LoadRates(None, None)) == "same_step"  # a CPU worker


def test_one_line_gives_both_rates_the_choice_and_the_cost() -> None:
    rates = LoadRates(21.3 * GB, 24.94 * GB, wave_bytes=1 << 30, seconds=0.314)
    assert auto_line(rates, "same_step") == (
        "load_mode auto: layer_wise 21.3 GB/s, same_step (copy engine) 24.9 GB/s -> same_step "
        "(1024 MiB wave, timed in 0.31 s)"
    )


def test_the_line_says_why_a_path_was_not_timed() -> None:
    rates = LoadRates(None, None, note="this worker copies synchronously", same_step_label="x")
    assert auto_line(rates, "same_step") == (
        "load_mode auto: layer_wise not timed, same_step (x) not timed -> same_step "
        "(this worker copies synchronously)"
    )
