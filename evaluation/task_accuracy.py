"""Accuracy of a task run at many lengths (and, for passkey, depths): how far the model retrieves.

Definition. An example is right when every one of its answer tokens is the model's most likely next token
(greedy argmax) given the true tokens before it (teacher forcing: the example is scored in one forward pass;
the earlier answers are given in context, as generation would produce them when it is right). Accuracy is the
share of right examples: exact match, so chance is the task's (e.g. n_symbols^-key_len for passkey).

Each cell (length, depth where the task has one, the scheme's evaluation-time variation) scores n fresh
examples from a held-out stream of its own, seeded from train.seed, the length and the depth (the same
examples for every variation and every evaluation), n the smallest with a 95% Wilson interval of half-width
at most eval.task_half_width whatever the accuracy (n = ceil(z² / (4 h²)): 385 for h = 0.05; Wilson's
half-width is largest at p = 1/2, where it is below the normal approximation's z·sqrt(p(1-p)/n)).
Each row reports that interval. The effective length is the longest evaluated length up to which accuracy
(random depth) stays at or above eval.task_threshold at every evaluated length; None when the shortest is below it
(effective_length; scripts/compare.py reports it over seeds at its own thresholds, and relative_effective_length).

Outputs, in ``<run_dir>/eval/``: tasks.json (accumulated over evaluations of one checkpoint, like
extrapolation.json), tasks.csv, accuracy_vs_length.png and, for passkey, depth_length.png (the depth × length
grid); and the same in the run's W&B run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.domain import domain, read_with
from core.errors import PosGPTError
from core.files import remove
from core.runtime import autocast
from data.tasks import Task, build_task, held_out_seed
from data.windows import random_positions
from evaluation.context import EvalContext, EvaluationPlan
from evaluation.render import length_header, render_table
from evaluation.results import condition_label
from evaluation.settings import TASK, AccuracyInterval, Batching
from evaluation.store import RowFormat, load_document

ACCURACY_PLOT = "accuracy_vs_length.png"
# A row's position in a task's grid besides length, where it has one: passkey's depth, the copy probe's
# distance (evaluation/copy_probe.py); rows without one are the accuracy-vs-length curve.
GRIDS = {
    "depth": "depth of the key (share of the filler before it)",
    "distance": "distance between the copies' starts (tokens)",
}
CSV_COLUMNS = [
    "task",
    "data",
    "split",
    "length",
    "multiple",
    "depth",
    "distance",
    "variation",
    "attn_temperature",
    "random_positions",
    "accuracy",
    "ci_low",
    "ci_high",
    "correct",
    "n",
    "copy_span",
    "copy_min_count",
    "copy_candidates",
    "token_accuracy",
    "mean_logprob",
    "control_logprob",
    "copy_gain",
    "seed",
    "seconds",
    "reason",
]
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def examples_for(half_width: float, z: float = Z_95) -> int:
    """The fewest examples whose Wilson (and normal-approximation) interval is at most ± half_width at any p."""
    return math.ceil(z * z / (4 * half_width * half_width))


def wilson_interval(correct: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion correct / n (Wilson 1927):
    (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    p = correct / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)
    # exactly 0 (1) when nothing (everything) is right, where rounding would leave ±1e-17
    return (0.0 if correct == 0 else low), (1.0 if correct == n else high)


@dataclass
class Matches:
    """What :func:`count_exact_matches` counted: the examples whose every answer token is right, and per answer
    token in order (the k-th answer token of each example that has k of them), how many are right of how many."""

    correct: int
    answer_correct: list[int]
    answer_n: list[int]


@torch.inference_mode()
def count_exact_matches(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    positions: torch.Tensor | None = None,
) -> Matches:
    """Examples (rows) whose every answer token (y != -100) is the argmax of the model's next-token logits, and
    each answer token's own count (which query of several, which read, fails); ``positions`` (rows, length): each
    example's positions, else 0..length-1."""
    per_batch = max(1, batch_tokens // x.shape[1])
    correct, n_answers = 0, int((y != -100).sum(dim=1).max()) if len(y) else 0
    answer_correct, answer_n = torch.zeros(n_answers, dtype=torch.long), torch.zeros(n_answers, dtype=torch.long)
    for i in range(0, len(x), per_batch):
        xb, yb = x[i : i + per_batch].to(device), y[i : i + per_batch].to(device)
        with autocast(device, dtype):
            if positions is None:
                logits = model(xb)
            else:
                logits = model(xb, positions=positions[i : i + per_batch].to(device))
        right, answer = (logits.argmax(dim=-1) == yb).cpu(), (yb != -100).cpu()
        correct += int((right | ~answer).all(dim=1).sum())
        order = answer.cumsum(dim=1)[answer] - 1  # each answer token's place among its example's answers
        answer_n += torch.bincount(order, minlength=n_answers)
        answer_correct += torch.bincount(order[right[answer]], minlength=n_answers)
    return Matches(correct, answer_correct.tolist(), answer_n.tolist())


def cells(task: Task, depths: list[float]) -> list[dict[str, Any]]:
    """The settings evaluated at each length: random depth ({}), then each depth of the grid (passkey)."""
    return [{}] + ([{"depth": float(d)} for d in depths] if "depth" in task.cells else [])


def evaluate_cell(
    model: torch.nn.Module,
    task: Task,
    length: int,
    cell: dict[str, Any],
    n: int,
    seed: int,
    batch_tokens: int,
    device: torch.device,
    dtype: torch.dtype,
    n_positions: int | None = None,
) -> dict[str, Any]:
    """One row: the accuracy of n held-out examples of ``length`` tokens and its 95% Wilson interval. The
    examples are generated at once, so they do not depend on how the forward passes are batched. ``n_positions``:
    each example at a sorted random subset of [0, n_positions) (eval.random_positions), drawn from its own seed."""
    started = time.perf_counter()
    x, y = task.sample(n, length, torch.Generator().manual_seed(seed), **cell)
    positions = None
    if n_positions:
        drawn = torch.Generator().manual_seed(held_out_seed(seed, "positions"))
        positions = random_positions(n, length, n_positions, drawn)
    matches = count_exact_matches(model, x, y, batch_tokens, device, dtype, positions)
    low, high = wilson_interval(matches.correct, n)
    return {
        "accuracy": matches.correct / n,
        "ci_low": low,
        "ci_high": high,
        "correct": matches.correct,
        "n": n,
        "answer_correct": matches.answer_correct,
        "answer_n": matches.answer_n,
        "seconds": round(time.perf_counter() - started, 3),
    }


_DEFAULT_DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]  # eval.task_depths: the key at the start, a quarter, ..., the end


@dataclass(frozen=True, kw_only=True)
class TaskSettings(AccuracyInterval, Batching):
    """The eval.* settings task accuracy reads: its own, and those it shares (evaluation/settings.py)."""

    # a grid of key depths, for a task whose keys have one (passkey: data/tasks/, Task.cells)
    task_depths: tuple[float, ...] = domain(default_factory=lambda: list(_DEFAULT_DEPTHS), ge=0, le=1, runs=TASK)
    # A task run trained with train.random_positions=N: score each example at a sorted random subset of [0, N), as
    # Ruoss et al. 2023 test, instead of at 0..L-1; its rows are labelled randpos:N
    random_positions: bool = read_with(False, runs=TASK)

    def check(self, plan: EvaluationPlan) -> None:
        """eval.task_depths is a grid for a task whose keys have a depth ([] asks for no grid, which any task can
        give); eval.random_positions draws a task example's positions from the [0, N) its run trained on
        (train.random_positions=N): every length must fit in it."""
        task = None if plan.task is None else build_task(plan.task)
        depths = list(self.task_depths)
        if task is not None and depths and depths != _DEFAULT_DEPTHS and "depth" not in task.cells:
            raise PosGPTError(
                f"eval.task_depths={depths} is a grid of key depths; task={task.name} has no depth to vary: drop it"
            )
        if not self.random_positions:
            return
        n = plan.train_random_positions
        if not n:  # a language-model run never gets here: the setting is a task run's (validate's run kinds)
            raise PosGPTError(
                f"eval.random_positions scores a task run at positions drawn from the [0, N) it trained on "
                f"(train.random_positions=N); this run has train.random_positions={n}: drop eval.random_positions"
            )
        longer = [length for length in plan.lengths if length > n]
        if longer:
            raise PosGPTError(
                f"eval.random_positions draws each example's positions from [0, train.random_positions={n}): the "
                f"lengths {longer} do not fit; drop them (eval.lengths or eval.length_multipliers)"
            )


def evaluate_task(ctx: EvalContext, task: Task, e: TaskSettings) -> list[dict[str, Any]]:
    """Rows for every evaluation-time variation of the scheme (as perplexity's), length and cell."""
    n = examples_for(e.task_half_width)
    n_positions = ctx.train_random_positions if e.random_positions else None  # checked at start-up
    rows = []
    for label, setting in ctx.variations():
        for length in dict.fromkeys(ctx.lengths):
            for cell in cells(task, list(e.task_depths)):
                seed = held_out_seed(ctx.train_seed, f"eval:{length}:{json.dumps(cell, sort_keys=True)}")
                row = {"task": task.name, "length": length, "depth": cell.get("depth"), **setting}
                row.update(seed=seed, split="held-out", random_positions=n_positions)
                if reason := ctx.model.pe.beyond_reach(length):  # as perplexity: not evaluable there
                    row.update(accuracy=None, n=0, reason=reason)
                else:
                    scored = evaluate_cell(
                        ctx.model, task, length, cell, n, seed, e.batch_tokens, ctx.device, ctx.dtype, n_positions
                    )
                    row.update(scored)
                rows.append(row)
                if ctx.progress:
                    print(f"eval: {task.name} {label} L={length} {cell or ''}: {_cell_text(row)}", flush=True)
    return rows


def grid_cell(row: dict[str, Any]) -> tuple[str, float] | None:
    """(dimension, value) of a row's place in its task's grid (see GRIDS), or None."""
    return next(((key, row[key]) for key in GRIDS if row.get(key) is not None), None)


FILE_UNSAFE = re.compile(r"[^\w.=-]+")  # what a heatmap's file name may not hold of a probe setting's label
# What a probe row measured besides its cell: the text the probe was written into and the probe's settings.
PROBE_SETTINGS = {"data": None, "corpus": None, "split": None, "copy_span": None, "copy_min_count": 0}


def probe_settings(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row.get(key, default) for key, default in PROBE_SETTINGS.items()}


def probe_labeller(rows: list[dict[str, Any]]) -> Callable[[dict[str, Any]], str]:
    """A function naming a row's probe settings among those that differ between ``rows`` ("" where none do):
    ``copy_min_count=1000``."""
    varying = [key for key in PROBE_SETTINGS if len({json.dumps(probe_settings(r)[key]) for r in rows}) > 1]
    return lambda row: " ".join(f"{key}={probe_settings(row)[key]}" for key in varying)


def _identity(row: dict[str, Any]) -> tuple:
    """What, besides evaluator, length, variation and temperature, identifies a task measurement. Probe rows of other
    text or settings are other measurements (rows written before copy_min_count existed drew from every token: 0)."""
    return (
        row["task"],
        grid_cell(row),
        json.dumps(probe_settings(row), sort_keys=True),
        row.get("random_positions"),  # None: at 0..L-1, as every row before eval.random_positions existed
    )


def sort_key(row: dict[str, Any]) -> tuple:
    label, cell = variation(row), grid_cell(row)
    return (label != "", label, cell is not None, cell or ("", 0.0), row["length"])


def effective_lengths(rows: list[dict[str, Any]], threshold: float) -> dict[str, int | None]:
    """Per variation label: the effective length (effective_length) of its rows at random depth."""
    by_label: dict[str, list[tuple[int, float | None]]] = {}
    for row in sorted((r for r in rows if grid_cell(r) is None), key=sort_key):
        by_label.setdefault(variation(row), []).append((row["length"], row["accuracy"]))
    return {label: effective_length(curve, threshold) for label, curve in by_label.items()}


def effective_length(curve: Iterable[tuple[int, float | None]], threshold: float) -> int | None:
    """The effective length of an accuracy curve ((length, accuracy) per evaluated length), as RULER defines it
    (Hsieh et al. 2024): the longest evaluated length L such that every evaluated length up to L, the shortest
    included, has accuracy >= threshold. The first length below it ends the search, so accuracy that recovers at
    a longer length does not count. None when the shortest evaluated length is already below it, or when nothing
    was evaluated. A length not evaluable there (None) or with no number (NaN) is below any threshold."""
    found = None
    for length, accuracy in sorted(curve, key=lambda point: point[0]):  # stable: a repeated length keeps its order
        if accuracy is None or not accuracy >= threshold:  # a NaN compares False: a failure
            break
        found = length
    return found


def relative_effective_length(
    curve: Iterable[tuple[int, float | None]], train_len: int, ratio: float, floor: float
) -> int | None:
    """The effective length at ``ratio`` times the curve's own accuracy at its training length (1x): how far a run
    keeps what it does at 1x. None where 1x was not evaluated (or not evaluable), or where its accuracy is below
    ``floor`` (the absolute threshold reported beside it): a run that does not do the task at 1x has nothing to
    keep, and at an accuracy near 0 every length would pass a threshold near 0."""
    points = list(curve)
    at_1x = [accuracy for length, accuracy in points if length == train_len]
    if len(at_1x) != 1 or at_1x[0] is None or not at_1x[0] >= floor:
        return None
    return effective_length(points, ratio * at_1x[0])


def variation(row: dict[str, Any]) -> str:
    """What a row was evaluated with ("" for the run as trained; ``yarn:8 logn``), as perplexity rows say it."""
    return condition_label(row)


def _cell_text(row: dict[str, Any]) -> str:
    return "n/a" if row["accuracy"] is None else f"{row['accuracy']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _row_label(row: dict[str, Any], grids: set[str]) -> str:
    """``yarn:8 depth 0.5``; a row of the run as trained off the grid of a task that has one (``grids``: the grid
    dimensions its rows use) is ``random <dimension>``, of a task without one ``as trained``."""
    cell = grid_cell(row)
    place = f"{cell[0]} {cell[1]:g}" if cell else ""
    off_grid = " ".join(f"random {name}" for name in sorted(grids)) or "as trained"
    return " ".join(part for part in (variation(row), place) if part) or off_grid


def _labels(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each row's line: its variation and grid cell, and the probe's settings where they differ."""
    rows = sorted(rows, key=sort_key)
    grids = {cell[0] for cell in map(grid_cell, rows) if cell}
    probe_label = probe_labeller(rows)
    return [(" ".join(part for part in (_row_label(row, grids), probe_label(row)) if part), row) for row in rows]


def _notes(document: dict[str, Any], lines: dict[str, dict[int, dict[str, Any]]]) -> str:
    """For the copy probe a second table, of copy_gain; then the effective lengths."""
    rows = document["results"]
    text = ""
    if any(row.get("copy_gain") is not None for row in rows):
        lengths = sorted({row["length"] for row in rows})
        columns = length_header(lengths, document["train_seq_len"])
        gains = [[label] + [_gain_text(c.get(L)) for L in lengths] for label, c in lines.items()]
        text = render_table(["copy_gain (nats the first copy adds)"] + columns, gains)
    effective = ", ".join(f"{label or 'as trained'}: {L}" for label, L in document["effective_length"].items())
    note = f"(effective length, accuracy >= {document['threshold']}: {effective})" if effective else ""
    return "\n".join(part for part in (text, note) if part)


def _gain_text(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return "n/a" if row.get("copy_gain") is None else f"{row['copy_gain']:+.3f}"


def _plots(document: dict[str, Any], eval_dir: Path, options: dict[str, Any]) -> dict[str, Path]:
    from evaluation.plots import Series, plot_accuracy_vs_length, plot_grid_heatmap  # matplotlib: when drawing

    pe, train_len, rows = document["pe"], document["train_seq_len"], document["results"]
    title = f"{document['task']}, pe={pe}"
    trained = f"trained at length {train_len} (step {document['step']})"
    curves: dict[str, Series] = {}
    for row in sorted((r for r in rows if grid_cell(r) is None), key=sort_key):
        label = variation(row) or "as trained"
        line = curves.setdefault(label, Series(label, pe, [], [], band=[]))
        if row["accuracy"] is not None:
            line.x.append(row["length"])
            line.y.append(row["accuracy"])
            line.band.append((row["ci_low"], row["ci_high"]))
    plots = {}
    if any(line.x for line in curves.values()):
        path = eval_dir / ACCURACY_PLOT
        plots["accuracy_vs_length"] = plot_accuracy_vs_length(
            list(curves.values()), {train_len}, path, f"{title}: accuracy by length", f"{trained}; band: 95% Wilson CI"
        )
    # A heatmap per grid and probe setting (distance_length.png; with several settings in tasks.json,
    # distance_length_copy_min_count=0.png, ...), drawn again from every row: earlier ones are replaced.
    probe_label = probe_labeller(rows)
    for old in (path for key in GRIDS for path in eval_dir.glob(f"{key}_length*.png")):
        remove(old)
    grid = [
        (*grid_cell(r), probe_label(r), r["length"], r["accuracy"]) for r in rows if grid_cell(r) and not variation(r)
    ]
    for key, ylabel in GRIDS.items():
        for setting in sorted({probe for name, _, probe, _, _ in grid if name == key}):
            cells = [
                (value, length, accuracy)
                for name, value, probe, length, accuracy in grid
                if (name, probe) == (key, setting)
            ]
            name = f"{key}_length" + ("_" + FILE_UNSAFE.sub("_", setting) if setting else "")
            caption = "; ".join(part for part in (trained, setting) if part)
            plots[name] = plot_grid_heatmap(
                cells, ylabel, eval_dir / f"{name}.png", f"{title}: accuracy by {key}", caption
            )
    return plots


def _summary(document: dict[str, Any]) -> dict[str, Any]:
    """Accuracy per variation and length (off the grid), and the effective lengths."""
    values: dict[str, Any] = {}
    for row in document["results"]:
        if row["accuracy"] is not None and grid_cell(row) is None:
            values[f"{variation(row) or 'as trained'}/accuracy@{row['length']}"] = row["accuracy"]
    for label, length in document["effective_length"].items():
        values[f"{label or 'as trained'}/effective_length"] = length
    return values


# A row's numeric values that tables read: the accuracy, the copy probe's log-probabilities (None where not scored).
NUMERIC_FIELDS = ("accuracy", "mean_logprob", "copy_gain", *GRIDS)


def _checked_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row whose task, length, count and values have the types every reader relies on; else a PosGPTError."""
    number = (int, float, type(None))
    if not (
        isinstance(row.get("task"), str)
        and isinstance(row.get("n", 0), int)
        and all(isinstance(row.get(key), number) for key in NUMERIC_FIELDS)
    ):
        raise PosGPTError(f"result at length {row['length']} lacks a task, an integer n or numeric values")
    return row


TASK_ROWS = RowFormat(
    file="tasks",
    value="accuracy",
    columns=tuple(CSV_COLUMNS),
    identity=_identity,
    sort=sort_key,
    labels=_labels,
    cell=_cell_text,
    title=lambda document: f"{document['task']} pe={document['pe']} accuracy",
    notes=_notes,
    plots=_plots,
    summary=_summary,
    evaluator_of=lambda row: "copy_probe" if row["task"] == "copy_probe" else "task_accuracy",
    required=frozenset({"task", "length"}),
    check=_checked_row,
    higher_is_better=True,
)
JSON_FILE, CSV_FILE = TASK_ROWS.json_file, TASK_ROWS.csv_file


def load_task_results(eval_dir: str | Path) -> dict[str, Any] | None:
    """The task document in ``eval_dir`` (tasks.json), or None where there is none; a damaged or malformed one is a
    PosGPTError naming it."""
    return load_document(eval_dir, TASK_ROWS)
