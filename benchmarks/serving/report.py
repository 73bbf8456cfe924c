"""Summaries of one mode's load: latency percentiles, throughput, hit rates, output check."""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from client import Load, Record
from vllm_server import metric_sum

# vLLM's counters (prompt tokens looked up / found) and vllm-marconi-offload's per-tier hits.
COUNTERS = {
    "queries": "vllm:prefix_cache_queries_total",
    "hbm_hits": "vllm:prefix_cache_hits_total",
    "external_queries": "vllm:external_prefix_cache_queries_total",
    "external_hits": "vllm:external_prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
}
TIER_HITS = "vllm:marconi_offload_hit_tokens_total"
# vLLM's per-request phase histograms: where a TTFT goes (waiting, then prefill) and decode.
PHASES = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear interpolation), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


def completed(load: Load) -> list[Record]:
    """The requests of `load` that ended (a first token and a last one) before its stop."""
    return [r for r in load.records if r.e2e_s is not None and r.ttft_s is not None]


def summarize(load: Load, duration_s: float, hbm_tokens: float) -> dict[str, Any]:
    """Latency percentiles of the completed requests (`cancelled` counts the others);
    output tokens/s and requests/s of the completed requests over the time to the last one's
    end; live KV against the HBM size."""
    done = completed(load)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    gaps = [g for r in done for g in r.gaps_s]
    e2e = [r.e2e_s for r in done if r.e2e_s is not None]
    out_tokens = sum(len(r.tokens) for r in done)
    steady = [n for t, n in load.live_tokens if duration_s / 2 <= t <= duration_s]
    prompt = sum(r.prompt_tokens for r in done)
    cached = [r.cached_tokens for r in done if r.cached_tokens is not None]
    return {
        "requests_sent": len(load.records),
        "completed": len(done),
        "cancelled": load.cancelled,
        "errors": sorted({r.error for r in load.records if r.error})[:5],
        "wall_s": round(load.wall_s, 2),
        "ttft_p50": _ms(percentile(ttft, 50)),
        "ttft_p90": _ms(percentile(ttft, 90)),
        "ttft_p99": _ms(percentile(ttft, 99)),
        "itl_p50": _ms(percentile(gaps, 50)),
        "itl_p99": _ms(percentile(gaps, 99)),
        "itl_max": _ms(max(gaps, default=None)),
        "e2e_p50": _ms(percentile(e2e, 50)),
        "output_tokens_per_s": round(out_tokens / load.wall_s, 1) if load.wall_s else None,
        "requests_per_s": round(len(done) / load.wall_s, 3) if load.wall_s else None,
        "prompt_tokens": prompt,
        "output_tokens": out_tokens,
        "cached_tokens_rate": round(sum(cached) / prompt, 4) if cached and prompt else None,
        "live_kv_over_hbm": {
            "mean_second_half": round(statistics.mean(steady) / hbm_tokens, 2) if steady else None,
            "peak": round(max((n for _, n in load.live_tokens), default=0) / hbm_tokens, 2),
        },
    }


def hits(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Counter deltas over the load, and hit rates: all hits (vLLM's own cache plus the
    connector's) over the tokens looked up, and the connector's over what it was asked."""
    delta = {
        key: metric_sum(after, name) - metric_sum(before, name) for key, name in COUNTERS.items()
    }
    tiers = {
        tier: metric_sum(after, TIER_HITS, tier=tier) - metric_sum(before, TIER_HITS, tier=tier)
        for tier in ("l1", "l2")
    }
    queries, external = delta["queries"], delta["external_queries"]
    return {
        **{key: int(value) for key, value in delta.items()},
        "ours_tier_hits": {tier: int(value) for tier, value in tiers.items()},
        "hit_rate": round((delta["hbm_hits"] + delta["external_hits"]) / queries, 4)
        if queries
        else None,
        "external_hit_rate": round(delta["external_hits"] / external, 4) if external else None,
    }


def phases(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Mean ms per request of each phase over the load, from vLLM's histograms' sum and count
    deltas (queue: scheduled after arrival; prefill: first scheduled to first token)."""
    means: dict[str, float | None] = {}
    for phase, name in PHASES.items():
        count = metric_sum(after, name + "_count") - metric_sum(before, name + "_count")
        total = metric_sum(after, name + "_sum") - metric_sum(before, name + "_sum")
        means[f"{phase}_mean_ms"] = round(1e3 * total / count, 1) if count else None
    return means


def timeline(load: Load) -> list[dict[str, Any]]:
    """Each completed request's times (`sent_s` from the load's start; the rest in ms) and
    token counts, for analyses beyond the percentiles (`long_gaps`)."""
    return [
        {
            "request": f"{r.sid}/{r.turn}",
            "sent_s": round(r.sent_s, 4),
            "ttft_ms": _ms(r.ttft_s),
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "gaps_ms": [round(g * 1e3, 2) for g in r.gaps_s],
        }
        for r in completed(load)
    ]


STEP_JITTER_S = 0.005
"""Chunks of one engine step reach the client up to a few ms apart (one stream each)."""


def long_gaps(requests: list[dict[str, Any]], threshold_ms: float) -> dict[str, Any]:
    """The engine steps behind inter-token gaps of at least `threshold_ms` (gaps ending
    within 10 ms of each other are one step, seen by every running request) and what ran
    in them: how many steps saw another request's first token (its prefill's last chunk
    ran in that step), and those prefills' uncomputed prompt tokens (prompt - cached)."""
    firsts = sorted(
        (r["sent_s"] + r["ttft_ms"] / 1e3, r["prompt_tokens"] - (r["cached_tokens"] or 0))
        for r in requests
    )
    times = [t for t, _ in firsts]
    slow: list[tuple[float, float]] = []  # (end, begin) of each gap at or above the threshold
    for r in requests:
        end = r["sent_s"] + r["ttft_ms"] / 1e3
        for gap in r["gaps_ms"]:
            begin, end = end, end + gap / 1e3
            if gap >= threshold_ms:
                slow.append((end, begin))
    steps: list[tuple[float, float]] = []
    for end, begin in sorted(slow):
        if not steps or end - steps[-1][0] > 2 * STEP_JITTER_S:
            steps.append((end, begin))
    prefilled = []
    for end, begin in steps:
        inside = firsts[
            bisect.bisect_left(times, begin) : bisect.bisect_right(times, end + STEP_JITTER_S)
        ]
        if inside:
            prefilled.append(sum(tokens for _, tokens in inside))
    return {
        "threshold_ms": round(threshold_ms, 1),
        "gaps": len(slow),
        "steps": len(steps),
        "steps_with_a_prefill_done": len(prefilled),
        "computed_prompt_tokens_mean": round(statistics.mean(prefilled)) if prefilled else None,
    }


def ttft_by_reuse(requests: list[dict[str, Any]], system_tokens: int) -> dict[str, Any]:
    """TTFT p50 and mean (ms) of the requests that found more than the shared system prompt
    cached (their session's own history: an HBM or offload hit) and of the others, with
    their counts; the load's TTFT percentiles mix both."""
    split: dict[str, list[float]] = {"reused": [], "fresh": []}
    for r in requests:
        reused = (r["cached_tokens"] or 0) > system_tokens
        split["reused" if reused else "fresh"].append(r["ttft_ms"])
    return {
        name: {
            "requests": len(times),
            "ttft_p50": None if not times else round(statistics.median(times), 1),
            "ttft_mean": None if not times else round(statistics.mean(times), 1),
        }
        for name, times in split.items()
    }


def outputs(load: Load) -> dict[str, list[int]]:
    """Generated token ids of each completed request, keyed `session/turn`."""
    return {f"{r.sid}/{r.turn}": r.tokens for r in load.records if r.e2e_s is not None}


def compare(mine: dict[str, list[int]], reference: dict[str, list[int]]) -> dict[str, Any]:
    """Requests both runs completed, how many generated identical tokens, how many the same
    first token (what the KV decides; later tokens of a random-weight model can part on
    arithmetic alone), the first few that differ (key and first differing position)."""
    common = sorted(set(mine) & set(reference))
    first = sum(mine[key][:1] == reference[key][:1] for key in common)
    differ = []
    for key in common:
        a, b = mine[key], reference[key]
        if a != b:
            pos = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            differ.append(
                {"request": key, "first_diff": pos if pos is not None else min(len(a), len(b))}
            )
    return {
        "compared": len(common),
        "identical": len(common) - len(differ),
        "first_token_identical": first,
        "differ": differ[:5],
    }


def first_token_agreement(
    runs: dict[str, dict[str, list[int]]], reference: dict[str, list[int]]
) -> str:
    """One line on the first tokens of several runs (label -> outputs) of one rate: at how
    many requests they all completed they agree with each other, and at which requests any
    of them parts from `reference` (the `none` run): where all part alike, the reference's
    own arithmetic is the likelier cause than a run's KV."""
    common = sorted(set.intersection(*(set(out) for out in runs.values())) & set(reference))
    agree = sum(len({tuple(out[key][:1]) for out in runs.values()}) == 1 for key in common)
    parted = [k for k in common if any(out[k][:1] != reference[k][:1] for out in runs.values())]
    line = f"first tokens of {', '.join(runs)} agree with each other at {agree} of {len(common)}"
    if not parted:
        return f"{line}; each equals the none run's"
    return f"{line}; at {', '.join(parted)} one or more part from the none run's"


COLUMNS = (
    ("rate", "rate", "{}"),
    ("mode", "mode", "{}"),
    ("done", "completed", "{}"),
    ("cut", "cancelled", "{}"),
    ("TTFT p50", "ttft_p50", "{:.0f}"),
    ("p90", "ttft_p90", "{:.0f}"),
    ("p99", "ttft_p99", "{:.0f}"),
    ("ITL p50", "itl_p50", "{:.1f}"),
    ("p99", "itl_p99", "{:.1f}"),
    ("E2E p50", "e2e_p50", "{:.0f}"),
    ("out tok/s", "output_tokens_per_s", "{:.1f}"),
    ("req/s", "requests_per_s", "{:.2f}"),
    ("hit %", "hit_pct", "{:.1f}"),
    ("queue", "queue_mean_ms", "{:.0f}"),
    ("prefill", "prefill_mean_ms", "{:.0f}"),
    ("preempt", "preemptions", "{}"),
    ("live/HBM", "live", "{}"),
    ("same as none", "same", "{}"),
    ("1st token", "first_same", "{}"),
    ("checks same", "verify_same", "{}"),
    ("checks 1st", "verify_first_same", "{}"),
)


def run_label(result: dict[str, Any]) -> str:
    """The mode, with the connector's `load_mode` where the run set one (`ours:same_step`),
    so runs of one mode under different load paths stay apart in a summary."""
    extra = (result.get("kv_transfer_config") or {}).get("kv_connector_extra_config") or {}
    load_mode = extra.get("load_mode")
    return f"{result['mode']}:{load_mode}" if load_mode else result["mode"]


def row(result: dict[str, Any]) -> dict[str, Any]:
    """The table's cells of one result (times in ms)."""
    live = result["live_kv_over_hbm"]
    hit = result["hits"]["hit_rate"]
    return {
        **result,
        **result.get("phases", {}),
        "preemptions": result["hits"].get("preemptions"),
        "rate": result["rate_label"],
        "mode": run_label(result),
        "hit_pct": None if hit is None else 100 * hit,
        "live": f"{live['mean_second_half']}x",
        "same": _fraction(result.get("identical_to_none")),
        "first_same": _fraction(result.get("identical_to_none"), "first_token_identical"),
        "verify_same": _fraction(result.get("verify_identical_to_none")),
        "verify_first_same": _fraction(
            result.get("verify_identical_to_none"), "first_token_identical"
        ),
    }


def _fraction(check: dict[str, Any] | None, field: str = "identical") -> str:
    """`field` of `check` over the requests compared; "-" where nothing was (or, for runs
    recorded before a field existed, "?")."""
    if check is None:
        return "-"
    return f"{check[field]}/{check['compared']}" if field in check else "?"


def table(results: list[dict[str, Any]]) -> str:
    """A fixed-width table of `results` (TTFT, ITL, E2E and mean queue and prefill in ms)."""
    cells = [
        [("-" if (v := row(r).get(key)) is None else fmt.format(v)) for _, key, fmt in COLUMNS]
        for r in results
    ]
    heads = [head for head, _, _ in COLUMNS]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)
