"""Hit rate vs capacity plot (needs the `plot` extra: matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .simulator import SimResult

__all__ = ["plot_sweep"]

# the reference lines stand out; Marconi variants get the default color cycle
_STYLES: dict[str, tuple[str, float, str | None]] = {
    "lru": ("-", 2.4, "black"),
    "belady": ("--", 2.4, "dimgray"),
    "auto": ("-", 2.4, "crimson"),
}


def plot_sweep(results: Sequence[SimResult], path: str | Path, title: str) -> None:
    """Write a PNG with one token-hit-rate line per policy over capacity."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'kv-eviction[plot]'") from exc
    by_policy: dict[str, list[SimResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=100)
    for policy, rows in by_policy.items():
        rows = sorted(rows, key=lambda r: r.capacity)
        style, width, color = _STYLES.get(policy, (":", 1.2, None))
        ax.plot(
            [r.capacity for r in rows],
            [100 * r.token_hit_rate for r in rows],
            style,
            marker="o",
            markersize=3,
            linewidth=width,
            color=color,
            label=policy,
        )
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (blocks)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
