"""The extrapolation plots (PNG), shared by eval (one run) and scripts/compare.py (many runs, many seeds).

- perplexity vs evaluation length: log-scaled axes, the training length marked;
- loss vs position within the window: where loss rises past the training length is where a scheme breaks.
  Drawn from the stored position bins (evaluation/extrapolation.py), one point per bin;
- validation loss vs training step (compare.py --val-curve): how fast each scheme learns, at 1x.

Each line is a Series; where it has half-widths (a mean over seeds), a shaded band shows the 95% CI.
Every scheme has one colour in every plot (scheme_colour); a scheme's settings (protocol, variation, other
keys) differ by line style. matplotlib's object-oriented API (Figure, not pyplot) keeps no global state and
needs no display.
"""

from __future__ import annotations

import colorsys
import hashlib
import io
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import PosGPTError
from core.files import atomic_write
from evaluation.schemes import COLOURS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# A title is one short line; the detail (data, protocol, step, what a band is) goes to a smaller caption under the
# figure, wrapped to its width at this many characters an inch (fontsize "small"), so that it is never cut off.
CAPTION_CHARS_PER_INCH = 14
PANEL_DETAIL_WIDTH = 45  # characters a line of a panel's detail (a task's settings) holds before it wraps
LINE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (10, 3)), "v"), ((0, (5, 2, 1, 2, 1, 2)), "P")]


def scheme_colour(scheme: str) -> str:
    """The colour of ``scheme`` in every plot: the one evaluation/schemes.py declares, and for any other name a hue
    taken from a hash of the name (md5, not hash(), which changes between Python processes), so a scheme
    added later keeps its colour and changes nobody else's."""
    if scheme in COLOURS:
        return COLOURS[scheme]
    hue = int(hashlib.md5(scheme.encode()).hexdigest()[:8], 16) / 2**32
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.75, 0.7)
    return f"#{round(red * 255):02x}{round(green * 255):02x}{round(blue * 255):02x}"


@dataclass
class Series:
    """One line: (x, y) points, and the half-width of y's 95% CI at each point (None: no band there)."""

    label: str
    scheme: str  # picks the colour
    x: list[float]
    y: list[float]
    half_width: list[float | None] | None = None
    band: list[tuple[float, float]] | None = None  # (low, high) of an asymmetric interval at each point


def bin_centre(lo: int, hi: int) -> float:
    """Where a bin of positions [lo, hi) is drawn on a log axis: the geometric centre of lo and hi - 1."""
    return math.sqrt(lo * (hi - 1))


def bins_note(rows: list[dict]) -> str:
    """How many scored tokens each point of a per-position plot averages, from the rows' stored bins."""
    tokens = [b["tokens"] for row in rows for b in row["per_position_bins"]]
    return f"each point: the mean loss over {min(tokens):,}-{max(tokens):,} scored tokens" if tokens else ""


def _draw(ax, series: list[Series]) -> None:
    """Colour by scheme, line style by the series' rank among its scheme's, band where half-widths exist."""
    seen: dict[str, int] = {}
    for line in series:
        rank = seen[line.scheme] = seen.get(line.scheme, -1) + 1
        style, marker = LINE_STYLES[rank % len(LINE_STYLES)]
        colour = scheme_colour(line.scheme)
        ax.plot(line.x, line.y, color=colour, linestyle=style, marker=marker, markersize=3, label=line.label)
        if line.band:
            low, high = zip(*line.band)
            ax.fill_between(line.x, low, high, color=colour, alpha=0.2, linewidth=0)
        elif line.half_width and any(h is not None for h in line.half_width):
            widths = [h or 0.0 for h in line.half_width]
            ax.fill_between(
                line.x,
                [y - h for y, h in zip(line.y, widths)],
                [y + h for y, h in zip(line.y, widths)],
                color=colour,
                alpha=0.2,
                linewidth=0,
            )


def _label_log_axis(axis, low: float, high: float) -> None:
    """Plain numbers (20, 300, 4,000; 19.5 over a narrow range) on a log axis; over a wide range only the
    minor ticks at 2 and 5 times a power of ten are labelled."""
    from matplotlib.ticker import FuncFormatter

    decimals = max(0, 1 - math.floor(math.log10(high - low)))

    def plain(value: float) -> str:
        return f"{value:,.{decimals}f}"

    wide = high / low > 20
    axis.set_major_formatter(FuncFormatter(lambda value, _: plain(value)))
    axis.set_minor_formatter(
        FuncFormatter(lambda value, _: plain(value) if not wide or f"{value:e}"[0] in "25" else "")
    )


def new_figure(height: float = 4.5, width: float = 7) -> Figure:
    """A figure (inches). matplotlib is imported here, at the first plot, not with this module: a command
    refused before it draws anything does not pay for it (about half a second)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def check_image_paths(paths: Mapping[str, str | Path | None]) -> None:
    """Refuse, before anything is computed or written, a plot path (named by its option) whose extension is not an
    image format matplotlib writes: the extension chooses the format (savefig would fail after the work, or
    add .png to a name without one)."""
    formats = new_figure().canvas.get_supported_filetypes()
    for option, path in paths.items():
        if path is not None and Path(path).suffix.lstrip(".").lower() not in formats:
            raise PosGPTError(
                f"{option} {path}: name an image file; its extension chooses the format (.png, .pdf, .svg, ...: "
                f"{', '.join(sorted(formats))})"
            )


def _mark_training_length(ax, train_lens: set[int]) -> None:
    for i, length in enumerate(sorted(train_lens)):
        ax.axvline(length, color="grey", linestyle="--", linewidth=1, label="training length" if i == 0 else None)


def _draw_by_length(ax, series: list[Series], train_lens: set[int]) -> None:
    """The series against evaluation length (those with points), on a log2 axis ticked at the lengths measured."""
    from matplotlib import ticker

    _draw(ax, [line for line in series if line.x])
    lengths = sorted({int(x) for line in series for x in line.x})
    _mark_training_length(ax, train_lens)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(length) for length in lengths])
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())


def add_titles(fig: Figure, title: str, caption: str = "") -> None:
    """``title`` above the figure (one short line), ``caption`` under it in smaller grey type, wrapped to the
    figure's width; the constrained layout makes room for both."""
    fig.suptitle(title)
    if caption:
        width = int(fig.get_figwidth() * CAPTION_CHARS_PER_INCH)
        fig.supxlabel(textwrap.fill(caption, width), fontsize="small", color="0.3")


def add_panel_title(ax, name: str, detail: str = "") -> None:
    """A panel's name on its left, and its detail (a task's settings) small on its right, wrapped to a few words
    a line, rather than one long title that runs past the panel."""
    ax.set_title(name, loc="left", fontsize="medium")
    if detail:
        ax.set_title(textwrap.fill(detail, PANEL_DETAIL_WIDTH), loc="right", fontsize="x-small", color="0.3")


def plot_ppl_vs_length(
    series: list[Series], train_lens: set[int], path: str | Path, title: str, caption: str = ""
) -> Path:
    """One line per series (x: lengths, y: perplexities; lengths without a perplexity left out)."""
    fig = new_figure()
    ax = fig.subplots()
    _draw_by_length(ax, series, train_lens)
    ax.set_yscale("log")
    _label_log_axis(ax.yaxis, *ax.get_ylim())
    add_titles(fig, title, caption)
    return _label_and_save(fig, ax, "evaluation length (tokens)", "perplexity", path)


def plot_per_position(
    series: list[Series], train_lens: set[int], path: str | Path, title: str, caption: str = ""
) -> Path:
    """One line per series (x: bin centres, y: mean loss in the bin)."""
    from matplotlib import ticker

    fig = new_figure()
    ax = fig.subplots()
    _draw(ax, series)
    _mark_training_length(ax, train_lens)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
    add_titles(fig, title, caption)
    return _label_and_save(fig, ax, "position in the window (1 = first token; log scale)", "mean loss (nats)", path)


def plot_accuracy_vs_length(
    series: list[Series], train_lens: set[int], path: str | Path, title: str, caption: str = ""
) -> Path:
    """Task accuracy (x: lengths, log scale; y: accuracy in [0, 1]), each series' 95% interval as its band."""
    return plot_value_vs_length(series, train_lens, path, title, caption, "exact-match accuracy", (-0.02, 1.02))


def plot_value_vs_length(
    series: list[Series],
    train_lens: set[int],
    path: str | Path,
    title: str,
    caption: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """Any measure by length (x: lengths, log scale; y: ``ylabel``), each series' band where it has one."""
    fig = new_figure()
    ax = fig.subplots()
    _draw_by_length(ax, series, train_lens)
    if ylim is not None:
        ax.set_ylim(*ylim)
    add_titles(fig, title, caption)
    return _label_and_save(fig, ax, "evaluation length (tokens)", ylabel, path)


CROWDED_LEGEND = 8  # entries above which a panel's legend goes beside it

# the y axis of a task panel, by the measure it draws (tasks.json's row fields)
TASK_AXES = {"accuracy": "exact-match accuracy", "copy_gain": "copy gain (nats the first copy adds)"}


@dataclass
class Panel:
    """A panel of a multi-panel figure: its name (one short line), its detail (a task's settings: small, beside
    the name) and what it draws."""

    name: str
    detail: str
    series: list[Series]
    train_lens: set[int]
    measure: str  # a key of TASK_AXES


def plot_task_panels(panels: list[Panel], path: str | Path, title: str, caption: str = "") -> Path:
    """plot_accuracy_vs_length's plot for several tasks or measures in one figure (scripts/compare.py): a panel per
    Panel, one above the other."""
    fig = new_figure(4.5 * len(panels))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels):
        _draw_by_length(ax, panel.series, panel.train_lens)
        if panel.measure == "accuracy":
            ax.set_ylim(-0.02, 1.02)
        _label(ax, "evaluation length (tokens)", TASK_AXES[panel.measure])
        add_panel_title(ax, panel.name, panel.detail)
    add_titles(fig, title, caption)
    return save(fig, path)


def _draw_grid(ax, grid: list[list[float]], fontsize: str | float = "small"):
    """An accuracy grid (rows × columns; nan: blank) coloured from 0 to 1, each cell's value printed in it, in
    the colour that reads on it; the image, for a colour bar."""
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if not math.isnan(value):
                colour = "white" if value < 0.5 else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=fontsize, color=colour)
    return image


def plot_grid_heatmap(
    cells: list[tuple[float, int, float | None]], ylabel: str, path: str | Path, title: str, caption: str = ""
) -> Path:
    """Accuracy over a (depth or distance) × length grid: (y, length, accuracy) cells; None: not evaluable, blank."""
    depths = sorted({d for d, _, _ in cells})
    lengths = sorted({length for _, length, _ in cells})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for depth, length, accuracy in cells:
        grid[depths.index(depth)][lengths.index(length)] = math.nan if accuracy is None else accuracy
    fig = new_figure()
    ax = fig.subplots()
    image = _draw_grid(ax, grid)
    ax.set_xticks(range(len(lengths)), [str(length) for length in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, label="exact-match accuracy")
    ax.set_xlabel("evaluation length (tokens)")
    add_titles(fig, title, caption)
    return save(fig, path)


@dataclass
class HeatmapPanel:
    """A task's grid of settings × lengths: ``values[i][j]`` is setting i's mean at lengths[j] (None: no value)."""

    name: str
    detail: str
    settings: list[str]
    lengths: list[int]
    train_len: int | None  # None: the settings trained at different lengths, so the ticks give lengths alone
    values: list[list[float | None]]


def plot_task_heatmaps(panels: list[HeatmapPanel], path: str | Path, title: str, caption: str = "") -> Path:
    """A heatmap per task (scripts/compare.py --task-heatmap), two panels a row: settings down, evaluation lengths
    across (each tick: the length and its multiple of the training length), the mean printed in each cell."""
    columns = min(2, len(panels))
    rows = math.ceil(len(panels) / columns)
    most = max(len(panel.settings) for panel in panels)
    # at least 3 inches: the title and the wrapped caption take their room first, and a grid of one or two rows
    # would leave its panels none (matplotlib then lays nothing out)
    fig = new_figure(height=max(3.0, rows * (1.2 + 0.3 * most)), width=6.5 * columns)
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    image = None
    for ax, panel in zip(axes, panels):
        grid = [[math.nan if value is None else value for value in row] for row in panel.values]
        image = _draw_grid(ax, grid, fontsize=7)
        ax.invert_yaxis()  # the first setting at the top, as in the tables
        ax.set_xticks(range(len(panel.lengths)), [_length_tick(n, panel.train_len) for n in panel.lengths])
        ax.set_yticks(range(len(panel.settings)), panel.settings)
        if panel.train_len in panel.lengths:  # the training length's edge: extrapolation lies to its right
            ax.axvline(panel.lengths.index(panel.train_len) + 0.5, color="white", linewidth=2)
        ax.tick_params(labelsize=8)
        add_panel_title(ax, panel.name, panel.detail)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes[: len(panels)].tolist(), label="exact-match accuracy", shrink=0.6)
    add_titles(fig, title, caption)
    return save(fig, path)


def _length_tick(length: int, train_len: int | None) -> str:
    """A heatmap column's tick: the length, and under it its multiple of the training length (0.5×, 16×)."""
    return f"{length}" if train_len is None else f"{length}\n{length / train_len:.3g}×"


def plot_training_curves(series: list[Series], path: str | Path, title: str, caption: str = "") -> Path:
    """One line per series (x: training steps, y: validation loss)."""
    fig = new_figure()
    ax = fig.subplots()
    _draw(ax, series)
    add_titles(fig, title, caption)
    return _label_and_save(fig, ax, "training step", "validation loss (nats)", path)


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig``; the bounding box is the drawn content's, so that nothing is cut off at an edge. A PNG is
    written with a palette of 256 colours: a quarter of the bytes of full colour, the same picture but for a
    colour bar's finest steps (a plot's lines and cells take a few dozen colours; the rest are their edges'
    blends). Other formats are written as matplotlib writes them. Either is written whole or not at all, never
    through a link (core.files.atomic_write); no text in it is read as matplotlib's mathematics (core.text)."""
    path = Path(path)
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # labels come from data (a run's name): a "$" in one is a dollar, never maths
        text.set_parse_math(False)
    rendered = io.BytesIO()
    if path.suffix.lower() != ".png":
        fig.savefig(rendered, format=path.suffix.lower().lstrip("."), dpi=120, bbox_inches="tight")
        return atomic_write(path, rendered.getvalue())  # whole or absent, never through a link
    from PIL import Image  # matplotlib's own dependency; imported at the first plot, as matplotlib is

    fig.savefig(rendered, format="png", dpi=120, bbox_inches="tight")
    return atomic_write(path, lambda f: Image.open(rendered).convert("RGB").quantize(256).save(f, format="PNG"))


def _label(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > CROWDED_LEGEND:  # beside the panel, where it hides no line
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize="small")


def _label_and_save(fig: Figure, ax, xlabel: str, ylabel: str, path: str | Path) -> Path:
    _label(ax, xlabel, ylabel)
    return save(fig, path)
