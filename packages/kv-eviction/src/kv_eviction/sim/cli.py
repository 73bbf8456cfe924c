"""`kv-eviction` command line: `simulate` replays a trace and prints hit-rate tables."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from .._version import __version__
from ..policy import EvictionPolicy, make_policy, policy_names
from .belady import BeladyPolicy
from .mooncake import read_mooncake
from .sharegpt import read_sharegpt
from .simulator import DEFAULT_KV_BYTES_PER_TOKEN, SimResult, simulate
from .synthetic import GENERATORS
from .trace import Trace

__all__ = ["DEFAULT_SWEEP", "load_trace", "main", "parse_policy_spec"]

TRACES = ("mooncake", "sharegpt", *GENERATORS)
DEFAULT_SWEEP = (
    "lru",
    *(
        f"marconi:{mode}:{decay}"
        for mode in ("linear", "log", "none")
        for decay in (0, 0.001, 0.01)
    ),
    "doorkeeper-lru",
    "doorkeeper-lfu-decay-1",
    "probation-lru",
    "auto",
    "belady",
)
DEFAULT_FRACTIONS = (0.05, 0.1, 0.2, 0.4)

PolicyMaker = Callable[[Trace], EvictionPolicy]
# make_policy's option names -> the `simulate` flags that set them
_FLAG_OF_OPTION = {"reuse_mode": "--reuse-mode", "decay": "--decay"}


def parse_policy_spec(spec: str) -> tuple[str, PolicyMaker]:
    """`lru`, `belady`, `auto` or `marconi[:reuse_mode[:decay]]` -> (label, factory)."""
    name, *rest = spec.split(":")
    if name == "belady":
        if rest:
            raise ValueError(f"policy spec {spec!r}: belady takes no options")
        return "belady", lambda trace: BeladyPolicy.for_requests(r.blocks for r in trace.requests)
    options: dict[str, object] = {}
    if name == "marconi":
        if len(rest) > 2:
            raise ValueError(f"policy spec {spec!r}: expected marconi[:reuse_mode[:decay]]")
        if rest:
            options["reuse_mode"] = rest[0]
        if len(rest) > 1:
            try:
                options["decay"] = float(rest[1])
            except ValueError:
                raise ValueError(
                    f"policy spec {spec!r}: decay {rest[1]!r} is not a number"
                ) from None
    elif rest:
        raise ValueError(f"policy spec {spec!r}: {name} takes no options in a spec")
    make_policy(name, **options)  # validate now, with the option-naming errors
    return spec, lambda trace: make_policy(name, **options)


def load_trace(name: str, *, limit: int = 0, block_size: int = 0, seed: int = 0) -> Trace:
    """A trace by name (`mooncake`, `sharegpt`, a generator) or a Mooncake JSONL path."""
    if name == "mooncake":
        return read_mooncake(limit=limit)
    if name == "sharegpt":
        extra = {"block_size": block_size} if block_size else {}
        return read_sharegpt(limit=limit or 2000, seed=seed, **extra)  # type: ignore[arg-type]
    if name in GENERATORS:
        extra = {"block_size": block_size} if block_size else {}
        if limit:
            extra["count"] = limit
        return GENERATORS[name](seed=seed, **extra)
    if name.endswith((".json", ".jsonl", ".jsonl.gz")) and not Path(name).is_file():
        raise ValueError(f"option --trace: no such file: {name!r}")
    if name.endswith(".json"):
        return read_sharegpt(name, limit=limit or 2000, seed=seed)
    if name.endswith((".jsonl", ".jsonl.gz")):
        return read_mooncake(
            name, limit=limit, **({"block_size": block_size} if block_size else {})
        )
    raise ValueError(
        f"option --trace: {name!r} is not a known trace; accepted values: "
        f"{', '.join(TRACES)}, a Mooncake .jsonl[.gz] path or a ShareGPT .json path"
    )


def _capacities(text: str | None, trace: Trace) -> list[int]:
    if text:
        try:
            values = [int(float(part)) for part in text.split(",") if part]
        except ValueError:
            raise ValueError(
                f"option --capacity: expected blocks like 2000,8000; got {text!r}"
            ) from None
        if not values or min(values) < 1:
            raise ValueError(f"option --capacity: capacities must be >= 1 block; got {text!r}")
        return values
    unique = trace.unique_blocks()
    return sorted({max(1, int(float(f"{unique * f:.2g}"))) for f in DEFAULT_FRACTIONS})


def format_table(results: Sequence[SimResult], block_size: int) -> str:
    """The detailed table: one row per (policy, capacity)."""
    lines = [
        "| policy | capacity (blocks) | token hit | request hit | blocks written | GiB written | evictions |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.policy} | {r.capacity:,} | {100 * r.token_hit_rate:.1f}% "
            f"| {100 * r.request_hit_rate:.1f}% | {r.blocks_written:,} "
            f"| {r.bytes_written / 2**30:,.0f} | {r.evictions:,} |"
        )
    return "\n".join(lines)


def format_matrix(results: Sequence[SimResult]) -> str:
    """Token hit rate, policies down, capacities across."""
    capacities = sorted({r.capacity for r in results})
    cells: dict[str, dict[int, float]] = {}
    for r in results:
        cells.setdefault(r.policy, {})[r.capacity] = r.token_hit_rate
    head = "| token hit rate | " + " | ".join(f"{c:,}" for c in capacities) + " |"
    lines = [head, "|---|" + "---:|" * len(capacities)]
    for policy, row in cells.items():
        best = {c: max(cells[p].get(c, 0.0) for p in cells if p != "belady") for c in capacities}
        values = []
        for c in capacities:
            text = f"{100 * row[c]:.1f}%" if c in row else "-"
            values.append(
                f"**{text}**" if policy != "belady" and c in row and row[c] == best[c] else text
            )
        lines.append(f"| {policy} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def _policy_makers(args: argparse.Namespace) -> list[tuple[str, PolicyMaker]]:
    """The policies to run, validated; errors name the flag that set the bad value."""
    if args.sweep:
        specs = args.policies.split(",") if args.policies else list(DEFAULT_SWEEP)
        try:
            return [parse_policy_spec(spec) for spec in specs]
        except ValueError as exc:
            raise ValueError(f"option --policies: {exc}") from None
    if args.policy != "marconi":
        return [parse_policy_spec(args.policy)]
    try:
        make_policy("marconi", reuse_mode=args.reuse_mode, decay=args.decay)
    except ValueError as exc:
        message = str(exc)
        for option, flag in _FLAG_OF_OPTION.items():
            message = message.replace(f"option {option!r}", f"option {flag}")
        raise ValueError(message) from None
    return [parse_policy_spec(f"marconi:{args.reuse_mode}:{args.decay:g}")]


def _require_plotting() -> None:
    """Fail before a long sweep, not after it, when --plot cannot write its PNG."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            "option --plot needs matplotlib, which is not installed: "
            "install the plot extra, 'kv-eviction[plot]'"
        ) from None


def _simulate_command(args: argparse.Namespace) -> None:
    makers = _policy_makers(args)
    if args.plot:
        _require_plotting()
    trace = load_trace(args.trace, limit=args.limit, block_size=args.block_size, seed=args.seed)
    capacities = _capacities(args.capacity, trace)
    print(
        f"# trace {trace.name}: {len(trace.requests):,} requests, {trace.unique_blocks():,} unique "
        f"blocks of {trace.block_size} tokens, {trace.block_accesses():,} block accesses; "
        f"admission threshold {args.admission_threshold}; one tick per request",
        flush=True,
    )
    results: list[SimResult] = []
    cells = [(label, maker, capacity) for label, maker in makers for capacity in capacities]
    # on stderr, and only when it is a terminal: piped tables stay clean
    with tqdm(cells, desc="simulate", unit="run", disable=None, leave=False) as progress:
        for label, maker, capacity in progress:
            progress.set_postfix_str(f"{label} @ {capacity:,} blocks")
            results.append(
                simulate(
                    trace,
                    maker,
                    capacity,
                    admission_threshold=args.admission_threshold,
                    kv_bytes_per_token=args.kv_bytes_per_token,
                    label=label,
                    store_partial_blocks=args.store_partial_blocks,
                )
            )
    if len(makers) > 1:
        print()
        print(format_matrix(results))
    print()
    print(format_table(results, trace.block_size))
    if args.plot:
        from .plot import plot_sweep

        plot_sweep(results, args.plot, f"{trace.name}: token hit rate vs capacity")
        print(f"\nwrote {args.plot}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kv-eviction", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a trace through a capacity-limited cache")
    sim.add_argument("--trace", default="mooncake", help=f"{', '.join(TRACES)} or a file path")
    sim.add_argument("--policy", default="marconi", choices=[*policy_names(), "belady"])
    sim.add_argument("--decay", type=float, default=0.0, help="marconi decay per tick (request)")
    sim.add_argument("--reuse-mode", default="linear", help="marconi reuse mode: linear, log, none")
    sim.add_argument(
        "--capacity",
        help="capacities in blocks, comma-separated (default: 5-40%% of unique blocks)",
    )
    sim.add_argument("--admission-threshold", type=int, default=1)
    sim.add_argument("--sweep", action="store_true", help="run every policy in --policies")
    sim.add_argument("--policies", help=f"sweep specs (default: {','.join(DEFAULT_SWEEP)})")
    sim.add_argument("--plot", help="write a PNG of token hit rate vs capacity (needs matplotlib)")
    sim.add_argument(
        "--limit", type=int, default=0, help="requests (mooncake) / conversations / sessions"
    )
    sim.add_argument(
        "--block-size", type=int, default=0, help="tokens per block (generated traces)"
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--kv-bytes-per-token", type=int, default=DEFAULT_KV_BYTES_PER_TOKEN)
    sim.add_argument(
        "--store-partial-blocks",
        action="store_true",
        help="also look up and store a prompt's trailing partial block (vLLM never does; "
        "the simulator's behaviour before 2026-12)",
    )
    sim.set_defaults(func=_simulate_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kv-eviction` console script."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, RuntimeError) as exc:
        print(f"kv-eviction: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
