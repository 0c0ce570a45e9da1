"""Task accuracy over seeds: each run's eval/tasks.json (evaluation/task_accuracy.py), aggregated like perplexity.

Rows are grouped by task identity (the task and its settings as trained; the copy probe's span and text), so
runs of other task settings are never pooled nor compared; per measure and grid cell, a table by length with
the highest mean in bold, the differences, and the paired ones against a baseline or the best.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.files import atomic_write
from data.tasks import TASKS
from evaluation.plots import HeatmapPanel, Panel, Series
from evaluation.render import length_header
from evaluation.stats import Estimate, mean_ci
from evaluation.task_accuracy import GRIDS, PROBE_SETTINGS, effective_lengths, grid_cell, probe_settings
from evaluation.task_accuracy import variation as row_variation
from reports.runs import TASK_MEASURES, Entry, Run, evaluated_with, group_by_seed, group_labels
from reports.tables import ACCURACY, differences, paired_report, table, told_apart_by_training_length

TASK_CSV_COLUMNS = ["task", "task_settings", "setting", *GRIDS, "length", "multiple", "measure", "seeds", "mean"]
TASK_CSV_COLUMNS += ["half_width", "ci_low", "ci_high", "values"]


def task_identity(row: dict[str, Any], document: dict[str, Any]) -> str:
    """What a task row measured besides its length, grid cell and variation, in words: the task and its settings
    (a task run's, as trained: "passkey (filler_len=5, key_len=4, n_symbols=10)"), and for the copy probe the span
    and the text it was written into (data, corpus, split). Rows of different identities are never pooled nor
    compared: a passkey run with another key_len, or trained on other lengths, is another table."""
    trained = document.get("task_config") or {}
    task = TASKS.get(trained.get("name"))
    # a setting added since the run was written reads as what the run was trained with (train_lengths=fixed)
    settings = {**(task.legacy_values if task else {}), **{k: v for k, v in trained.items() if k != "name"}}
    if row.get("data") is not None:  # a probe of held-out text (every probe row records its text)
        # its settings (evaluation/task_accuracy.py) other than their defaults (copy_min_count=0 draws from every
        # token); files from before 2026-11-24 record copy_span once, in the document
        probe = probe_settings({"copy_span": document.get("copy_span"), **row})
        settings.update({key: value for key, value in probe.items() if value != PROBE_SETTINGS[key]})
    described = ", ".join(f"{key}={value}" for key, value in sorted(settings.items()))
    return row["task"] + (f" ({described})" if described else "")


@dataclass
class TaskEntry(Entry):
    """A task table's row: one setting and variation (label), at one grid cell of one task identity."""

    identity: str = ""
    cell: tuple[str, float] | None = None  # evaluation/task_accuracy.py grid_cell: ("depth", 0.5), None: no grid cell
    # per seed, (its effective length, the threshold that defines it: the run's eval.task_threshold); no grid cell only
    effective: list[tuple[int | None, float]] = field(default_factory=list)


def task_entries(runs: list[Run]) -> list[TaskEntry]:
    """One entry per (setting, variation, task identity, grid cell), its rows pooled over the setting's seeds;
    settings are found and labelled among the runs of one task ("rope", not "rope task.name=mqar ..."). In the
    order: identity, cell (none first), setting as given, variation (none first)."""
    by_task: dict[str, list[Run]] = {}
    for run in runs:
        if run.tasks is not None:
            by_task.setdefault(run.tasks["task"], []).append(run)
    entries = []
    for members in by_task.values():
        groups = group_by_seed(members)
        for group, label in zip(groups, group_labels(groups)):
            cells: dict[tuple, dict[int, dict[int, dict[str, Any]]]] = {}  # (identity, cell, variation) -> run -> ...
            for i, run in enumerate(group):
                for row in run.tasks["results"]:
                    key = (task_identity(row, run.tasks), grid_cell(row), evaluated_with(row, run))
                    cells.setdefault(key, {}).setdefault(i, {})[row["length"]] = row
            for (identity, cell, variation), by_run in sorted(cells.items(), key=lambda item: item[0][2] != ""):
                indices = sorted(by_run)
                effective = []  # as eval.py finds it, from the rows pooled here
                for i in indices:
                    threshold = group[i].tasks.get("threshold")
                    if cell is None and threshold is not None:
                        rows = list(by_run[i].values())
                        # keyed by eval.py's label, which names a trained temperature that ``variation`` leaves out
                        effective.append((effective_lengths(rows, threshold)[row_variation(rows[0])], threshold))
                entries.append(
                    TaskEntry(
                        label + (f" {variation}" if variation else ""),
                        group[0].pe,
                        group[0].tasks["train_seq_len"],
                        [by_run[i] for i in indices],
                        [group[i].config["train"]["seed"] for i in indices],
                        identity=identity,
                        cell=cell,
                        effective=effective,
                    )
                )
    identities = list(dict.fromkeys(entry.identity for entry in entries))
    return sorted(entries, key=lambda e: (identities.index(e.identity), e.cell is not None, e.cell or ("", 0.0)))


def task_values(measure: str) -> Callable[[Entry, int], dict[int, float]]:
    """{train.seed: the row's ``measure``} at a length, over the seeds with a value there (None: not evaluable)."""

    def values(entry: Entry, length: int) -> dict[int, float]:
        return {
            seed: rows[length][measure]
            for seed, rows in zip(entry.seeds, entry.per_seed)
            if length in rows and rows[length].get(measure) is not None
        }

    return values


def task_estimate(measure: str) -> Callable[[Entry, int], Estimate | None]:
    """Mean ± CI over seeds of ``measure`` at a length (None where no seed has a value)."""
    values = task_values(measure)

    def estimate(entry: Entry, length: int) -> Estimate | None:
        found = values(entry, length)
        return mean_ci(list(found.values())) if found else None

    return estimate


def task_tables(entries: list[TaskEntry]) -> list[tuple[str, list[TaskEntry], list[tuple[str, list[TaskEntry]]]]]:
    """(identity, its entries, its classes) per task identity; a class is (title, the entries at one grid cell):
    what is compared within one table. Titles: "" without a grid, else "random depth", "depth 0.25", ..."""
    tables = []
    for identity in dict.fromkeys(entry.identity for entry in entries):
        members = [entry for entry in entries if entry.identity == identity]
        dimensions = {entry.cell[0] for entry in members if entry.cell}
        classes: dict[tuple | None, list[TaskEntry]] = {}
        for entry in members:
            classes.setdefault(entry.cell, []).append(entry)
        titled = [
            (f"{cell[0]} {cell[1]:g}" if cell else " or ".join(f"random {d}" for d in sorted(dimensions)), group)
            for cell, group in classes.items()
        ]
        tables.append((identity, members, titled))
    return tables


def task_measures(members: list[TaskEntry]) -> list[str]:
    rows = [row for entry in members for seed in entry.per_seed for row in seed.values()]
    return [measure for measure in TASK_MEASURES if any(row.get(measure) is not None for row in rows)]


def task_report(entries: list[TaskEntry], baseline: str | None = None) -> str:
    """Per task identity and measure: per grid cell, the table of mean ± CI over seeds by length, which settings'
    intervals are apart from the best's, and the paired differences against ``baseline`` (a setting's label,
    where the table has it) or else the best."""
    parts: list[str] = []
    for identity, members, classes in task_tables(entries):
        references = [entry for entry in members if entry.label == baseline]  # by the label the user gave
        common_train_len = told_apart_by_training_length(members)
        examples = sorted({row["n"] for entry in members for seed in entry.per_seed for row in seed.values()} - {0})
        n_text = f"{examples[0]}" if len(examples) == 1 else f"{examples[0]}-{examples[-1]}" if examples else "no"
        parts += ["", f"## Task: {identity}"]
        for measure in task_measures(members):
            values, estimate = task_values(measure), task_estimate(measure)
            parts += [
                "",
                f"{TASK_MEASURES[measure]} by evaluation length (eval/tasks.json; training length "
                f"{common_train_len or 'per row'}): mean over seeds ± half-width of the 95% confidence interval "
                "over seeds (Student t, n−1 degrees of freedom; one seed: the value alone; (n=k): only k seeds "
                f"have a value there). Each seed's value scores {n_text} held-out examples per cell (its own 95% "
                "Wilson interval is in its tasks.json). n/a: not evaluable there (tasks.json says why).",
            ]
            for title, members_at in classes:
                lengths = sorted({length for entry in members_at for seed in entry.per_seed for length in seed})
                header = length_header(lengths, common_train_len)
                parts += ["", f"{title}:"] if title else []
                parts += ["", table(members_at, lengths, header, estimate, digits=3, reading=ACCURACY)]
                if measure == "accuracy":
                    parts += effective_length_note(members_at)
                if len(members_at) < 2:  # nothing to compare with
                    continue
                if not any(len(entry.per_seed) > 1 for entry in members_at):
                    parts += ["", "One seed per setting: no intervals, so no difference is claimed."]
                    continue
                reference = next((entry for entry in members_at if any(entry is r for r in references)), None)
                parts += [
                    "",
                    "Differences: a setting differs from the highest one at a length when their 95% intervals "
                    "do not overlap (a conservative rule).",
                    *differences(members_at, lengths, header, estimate, ACCURACY),
                    *paired_report(members_at, lengths, header, values, reference, ACCURACY),
                ]
    return "\n".join(parts).lstrip("\n") + "\n"


def effective_length_note(entries: list[TaskEntry]) -> list[str]:
    """The effective length of each setting's seeds (evaluation/task_accuracy.py: the longest evaluated length up to
    which accuracy stays at or above the threshold at every length), where the entries have one (no grid cell)."""
    found = [entry for entry in entries if entry.effective]
    if not found:
        return []
    thresholds = sorted({threshold for entry in found for _, threshold in entry.effective})
    described = "; ".join(
        f"{entry.label}: {', '.join('-' if length is None else str(length) for length, _ in entry.effective)}"
        for entry in found
    )
    return [
        "",
        f"Effective length (the longest length up to which accuracy ≥ {' or '.join(map(str, thresholds))} at every "
        f"evaluated length; per seed, - where the shortest is below it): {described}.",
    ]


def task_csv(entries: list[TaskEntry], path: Path) -> Path:
    """One line per (identity, setting, grid cell, length, measure): the mean, its interval and every seed's value."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=TASK_CSV_COLUMNS)
    writer.writeheader()
    for entry in entries:
        task, _, settings = entry.identity.partition(" (")
        for measure in task_measures([entry]):
            values, estimate = task_values(measure), task_estimate(measure)
            for length in sorted({length for seed in entry.per_seed for length in seed}):
                value = estimate(entry, length)
                writer.writerow(
                    {
                        "task": task,
                        "task_settings": settings.removesuffix(")"),
                        "setting": entry.label,
                        **{key: (entry.cell[1] if entry.cell and entry.cell[0] == key else None) for key in GRIDS},
                        "length": length,
                        "multiple": round(length / entry.train_len, 4),
                        "measure": measure,
                        "seeds": 0 if value is None else value.n,
                        "mean": None if value is None else value.mean,
                        "half_width": None if value is None else value.half_width,
                        "ci_low": None if value is None or value.half_width is None else value.low,
                        "ci_high": None if value is None or value.half_width is None else value.high,
                        "values": json.dumps(values(entry, length)),
                    }
                )
    return atomic_write(path, text.getvalue())


def task_panels(entries: list[TaskEntry]) -> list[Panel]:
    """Per task identity, accuracy vs length with its CI band, one line per setting: at no grid cell (random
    depth), or, for a task measured only on a grid (the copy probe's distances), at its first cell; where the
    rows have a copy_gain (the copy probe's), a second panel of it, which says more than an accuracy of 0 does."""
    panels = []
    for identity, members, classes in task_tables(entries):
        title, cell_members = classes[0]
        for measure in [m for m in ("accuracy", "copy_gain") if m in task_measures(members)]:
            estimate = task_estimate(measure)
            series = []
            for entry in cell_members:
                points = [
                    (length, value)
                    for length in sorted({length for seed in entry.per_seed for length in seed})
                    if (value := estimate(entry, length)) is not None
                ]
                x, y, widths = [p[0] for p in points], [p[1].mean for p in points], [p[1].half_width for p in points]
                series.append(Series(entry.label, entry.scheme, x, y, widths))
            train_lens = {entry.train_len for entry in cell_members}
            panels.append(Panel(*panel_names(identity, title), series, train_lens, measure))
    return panels


def panel_names(identity: str, cell_title: str) -> tuple[str, str]:
    """A panel's name (the task, and its grid cell: "passkey, random depth") and its detail (the task's settings),
    from an identity "passkey (filler_len=5, ...)"."""
    task, _, settings = identity.partition(" (")
    return task + (f", {cell_title}" if cell_title else ""), settings.removesuffix(")")


def task_heatmap_panels(entries: list[TaskEntry]) -> list[HeatmapPanel]:
    """Per task identity, its accuracy table as a grid: a row per setting, a column per evaluated length, each cell
    the mean over seeds (None where no seed has a value: not evaluable, or not evaluated), at the cell task_panels
    draws (random depth; the copy probe's first distance)."""
    panels = []
    estimate = task_estimate("accuracy")
    for identity, members, classes in task_tables(entries):
        title, cell_members = classes[0]
        if "accuracy" not in task_measures(members):
            continue
        lengths = sorted({length for entry in cell_members for seed in entry.per_seed for length in seed})
        values = [
            [None if (value := estimate(entry, length)) is None else value.mean for length in lengths]
            for entry in cell_members
        ]
        settings = [entry.label for entry in cell_members]
        train_lens = {entry.train_len for entry in cell_members}
        train_len = next(iter(train_lens)) if len(train_lens) == 1 else None  # else no multiple means the same
        panels.append(HeatmapPanel(*panel_names(identity, title), settings, lengths, train_len, values))
    return panels
