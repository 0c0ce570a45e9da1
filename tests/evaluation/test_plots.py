"""Every plot reads at a glance and nothing in it is cut off: the title is one short line, its detail a caption, and
after drawing, every piece of text and every panel (tick labels, legends beside a panel) lies inside the figure.
Drawn with Agg (no display, deterministic), from series as crowded as the committed studies' (16 schemes)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from evaluation import plots
from evaluation.plots import HeatmapPanel, Panel, Series

SCHEMES = ["rope", "none", "t5", "alibi", "sinusoidal", "learned", "kerple", "fire", "xpos", "p_rope", "hybrid"]
SCHEMES += ["cope", "fox", "path", "stickbreaking", "pope"]
LENGTHS = [32, 48, 64, 128, 256, 512, 1024]
SETTINGS = "min_pairs=1, n_keys=32, n_pairs=8, n_values=32, power_a=0.01, train_lengths=uniform"
CAPTION = (
    "nonoverlapping protocol, data stdlib; band: 95% CI over seeds; each point: the mean loss over 1,024-32,768 "
    "scored tokens per seed, and a caption long enough to need wrapping twice over at this figure's width"
)


def series(scale: float = 1.0) -> list[Series]:
    return [
        Series(f"{scheme} pe.base=500000" if i % 5 == 0 else scheme, scheme, LENGTHS, [scale * (i + 1)] * 7, [0.1] * 7)
        for i, scheme in enumerate(SCHEMES)
    ]


def draw_each(monkeypatch) -> list[Figure]:
    """The figures the plot functions save, kept instead of written."""
    drawn: list[Figure] = []
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(fig))
    plots.plot_per_position(series(), {64}, "p.png", "Loss by position in windows of 1024", CAPTION)
    plots.plot_ppl_vs_length(series(10.0), {64}, "l.png", "Perplexity by evaluation length", CAPTION)
    accuracy = [Series(s.label, s.scheme, s.x, [0.5] * 7, s.half_width) for s in series()]
    panels = [Panel(task, SETTINGS, accuracy, {64}, "accuracy") for task in ("copy", "mqar", "passkey")]
    plots.plot_task_panels(panels, "t.png", "Task results by evaluation length", CAPTION)
    grid = HeatmapPanel("mqar", SETTINGS, [f"{s} (NoPE)" for s in SCHEMES], LENGTHS, 64, [[0.5] * 7 for _ in SCHEMES])
    plots.plot_task_heatmaps([grid] * 3, "h.png", "Exact match by evaluation length", CAPTION)
    return drawn


def outside(fig: Figure) -> list[str]:
    """What, once drawn, reaches past the figure's edges: each text (titles, captions, labels, legends, cell values)
    and each panel with its tick labels (ticks past a view limit are not drawn, so they are checked as the panel)."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox.padded(0.5)  # half a pixel: rounding
    found = []
    for text in fig.findobj(Text):
        in_ticks = any(
            text in ax.xaxis.get_ticklabels(which="both") + ax.yaxis.get_ticklabels(which="both") for ax in fig.axes
        )
        if text.get_visible() and text.get_text() and not in_ticks:
            box = text.get_window_extent(renderer)
            if not (edge.contains(box.x0, box.y0) and edge.contains(box.x1, box.y1)):
                found.append(f"text {text.get_text()!r} at {box}")
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer)
        if ax.get_visible() and not (edge.contains(box.x0, box.y0) and edge.contains(box.x1, box.y1)):
            found.append(f"panel {ax.get_title(loc='left')!r} at {box}")
    return found


@pytest.mark.slow
def test_every_text_of_the_main_plots_lies_inside_the_figure(monkeypatch):
    figures = draw_each(monkeypatch)
    assert len(figures) == 4
    for fig in figures:
        assert outside(fig) == []


def test_a_title_is_one_short_line_and_its_detail_a_caption(monkeypatch):
    for fig in draw_each(monkeypatch):
        title = fig.get_suptitle()
        assert "\n" not in title and len(title) <= 40, title
        caption = fig._supxlabel.get_text()
        assert caption.replace("\n", " ") == CAPTION and "\n" in caption  # wrapped to the figure, not cut off


@pytest.mark.parametrize("width", [5, 7, 13])
def test_a_caption_wraps_to_its_figure_width(width):
    fig = plots.new_figure(width=width)
    fig.subplots()
    plots.add_titles(fig, "Title", CAPTION * 2)
    assert outside(fig) == []


def test_a_png_is_written_with_a_palette_that_keeps_the_picture_and_other_formats_as_matplotlib_writes_them(tmp_path):
    """plots.save: a PNG of at most 256 colours, the size of the full-colour render, every pixel near its colour
    there; an SVG is matplotlib's own."""
    fig = plots.new_figure()
    ax = fig.subplots()
    for i, line in enumerate(series()):
        ax.fill_between(line.x, [y - 1 for y in line.y], [y + 1 for y in line.y], alpha=0.2, color=f"C{i % 10}")
        ax.plot(line.x, line.y, label=line.label)
    ax.legend()
    full = io.BytesIO()
    fig.savefig(full, format="png", dpi=120, bbox_inches="tight")
    reference = np.asarray(Image.open(full).convert("RGB"), dtype=float)
    written = Image.open(plots.save(fig, tmp_path / "plot.png"))
    assert written.mode == "P" and len(written.getcolors(256)) <= 256
    pixels = np.asarray(written.convert("RGB"), dtype=float)
    assert pixels.shape == reference.shape
    assert np.abs(pixels - reference).mean() < 0.5 and np.abs(pixels - reference).max() <= 48  # of 255
    assert (tmp_path / "plot.png").stat().st_size < 0.5 * len(full.getvalue())
    assert plots.save(fig, tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")
