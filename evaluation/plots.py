"""The two extrapolation plots (PNG), shared by eval (one run) and scripts/compare.py (many runs).

- perplexity vs evaluation length: log-scaled axes, the training length marked;
- loss vs position within the window: where loss rises past the training length is where a scheme breaks.
  Per-position means come from few windows each, so they are averaged over bins of positions that widen
  geometrically (the x axis is logarithmic, so every bin is drawn about as wide).

matplotlib's object-oriented API (Figure, not pyplot) keeps no global state and needs no display.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, ScalarFormatter

Curve = tuple[str, list[tuple[int, float | None]]]  # (label, [(length, ppl or None), ...])


def _label_log_axis(axis, low: float, high: float) -> None:
    """Plain numbers (20, 300, 4,000; 19.5 over a narrow range) on a log axis; over a wide range only the
    minor ticks at 2 and 5 times a power of ten are labelled."""
    decimals = max(0, 1 - math.floor(math.log10(high - low)))

    def plain(value: float) -> str:
        return f"{value:,.{decimals}f}"

    wide = high / low > 20
    axis.set_major_formatter(FuncFormatter(lambda value, _: plain(value)))
    axis.set_minor_formatter(FuncFormatter(
        lambda value, _: plain(value) if not wide or f"{value:e}"[0] in "25" else ""))


def _mark_training_length(ax, train_lens: set[int]) -> None:
    for i, length in enumerate(sorted(train_lens)):
        ax.axvline(length, color="grey", linestyle="--", linewidth=1,
                   label="training length" if i == 0 else None)


def plot_ppl_vs_length(curves: list[Curve], train_lens: set[int], path: str | Path, title: str) -> Path:
    """One line per curve; points with ppl None (not evaluable) are left out."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    lengths = sorted({length for _, points in curves for length, _ in points})
    for label, points in curves:
        kept = [(length, ppl) for length, ppl in sorted(points) if ppl is not None]
        if kept:
            ax.plot(*zip(*kept), marker="o", label=label)
    _mark_training_length(ax, train_lens)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(length) for length in lengths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    _label_log_axis(ax.yaxis, *ax.get_ylim())
    return _label_and_save(fig, ax, "evaluation length (tokens)", "perplexity", title, path)


def binned_positions(values: list[float | None], n_bins: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): x the geometric centre of each bin of 1-based positions, y the mean of its non-null values."""
    losses = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    edges = np.unique(np.geomspace(1, len(losses) + 1, n_bins + 1).round().astype(int))
    xs, ys = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        chunk = losses[lo - 1 : hi - 1]
        if np.isfinite(chunk).any():
            xs.append(np.sqrt(lo * (hi - 1)))
            ys.append(np.nanmean(chunk))
    return np.array(xs), np.array(ys)


def plot_per_position(curves: list[tuple[str, list[float | None]]], train_lens: set[int], path: str | Path,
                      title: str) -> Path:
    """One line per (label, per-position mean losses)."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    for label, values in curves:
        x, y = binned_positions(values)
        ax.plot(x, y, label=label)
    _mark_training_length(ax, train_lens)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    return _label_and_save(fig, ax, "position in the window (1 = first token; log scale)", "mean loss (nats)", title,
                           path)


def _label_and_save(fig: Figure, ax, xlabel: str, ylabel: str, title: str, path: str | Path) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return Path(path)
