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
from evaluation.task_accuracy import (
    GRIDS,
    PROBE_SETTINGS,
    effective_length,
    effective_lengths,
    grid_cell,
    probe_settings,
    relative_effective_length,
)
from evaluation.task_accuracy import variation as row_variation
from reports.runs import TASK_MEASURES, Entry, Run, evaluated_with, group_by_seed, group_labels
from reports.tables import ACCURACY, differences, estimate_table, paired_report, table, told_apart_by_training_length

TASK_CSV_COLUMNS = ["task", "task_settings", "setting", *GRIDS, "length", "multiple", "measure", "seeds", "mean"]
TASK_CSV_COLUMNS += ["half_width", "ci_low", "ci_high", "values", "threshold"]


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


def task_csv(entries: list[TaskEntry], path: Path, thresholds: Thresholds | None = None) -> Path:
    """One line per (identity, setting, grid cell, length, measure): the mean, its interval and every seed's value;
    with ``thresholds``, after each setting at no grid cell its two effective lengths (measure
    effective_length_absolute or effective_length_relative, the threshold in its column, no length)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=TASK_CSV_COLUMNS)
    writer.writeheader()
    for entry in entries:
        for measure in task_measures([entry]):
            values, estimate = task_values(measure), task_estimate(measure)
            for length in sorted({length for seed in entry.per_seed for length in seed}):
                line = csv_line(entry, measure, estimate(entry, length), values(entry, length))
                writer.writerow({**line, "length": length, "multiple": round(length / entry.train_len, 4)})
        if thresholds is not None and entry.cell is None:
            found = seed_effective_lengths(entry, thresholds)
            for kind, threshold in (("absolute", thresholds.absolute), ("relative", thresholds.relative)):
                line = csv_line(entry, f"effective_length_{kind}", length_estimate(found[kind]), found[kind])
                writer.writerow({**line, "threshold": threshold})
    return atomic_write(path, text.getvalue())


def csv_line(entry: TaskEntry, measure: str, value: Estimate | None, values: dict[int, Any]) -> dict[str, Any]:
    """A task CSV line's columns but its length, multiple and threshold: what it measured, of which setting, its
    mean over seeds and interval (empty without a value) and each seed's value (JSON, keyed by train.seed)."""
    task, _, settings = entry.identity.partition(" (")
    return {
        "task": task,
        "task_settings": settings.removesuffix(")"),
        "setting": entry.label,
        **{key: (entry.cell[1] if entry.cell and entry.cell[0] == key else None) for key in GRIDS},
        "measure": measure,
        "seeds": 0 if value is None else value.n,
        "mean": None if value is None else value.mean,
        "half_width": None if value is None else value.half_width,
        "ci_low": None if value is None or value.half_width is None else value.low,
        "ci_high": None if value is None or value.half_width is None else value.high,
        "values": json.dumps(values),
    }


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


def task_depth_heatmap_panels(entries: list[TaskEntry]) -> list[HeatmapPanel]:
    """Per task identity and setting whose rows have a depth grid (passkey's eval.task_depths): its accuracy as a
    grid of depths (down) × evaluated lengths (across), each cell the mean over the setting's seeds (None where no
    seed has a value), in the tables' order of settings."""
    estimate = task_estimate("accuracy")
    by_setting: dict[tuple[str, str], list[TaskEntry]] = {}
    for entry in entries:
        if entry.cell is not None and entry.cell[0] == "depth":
            by_setting.setdefault((entry.identity, entry.label), []).append(entry)
    panels = []
    for (identity, label), depths in by_setting.items():
        depths.sort(key=lambda entry: entry.cell[1])
        lengths = sorted({length for entry in depths for seed in entry.per_seed for length in seed})
        values = [
            [None if (value := estimate(entry, length)) is None else value.mean for length in lengths]
            for entry in depths
        ]
        task, settings = panel_names(identity, "")
        rows = [f"depth {entry.cell[1]:g}" for entry in depths]
        panels.append(HeatmapPanel(f"{task}, {label}", settings, rows, lengths, depths[0].train_len, values))
    return panels


@dataclass(frozen=True)
class Thresholds:
    """The two thresholds of the effective context length (effective_length_report): ``absolute``, an accuracy
    fixed in advance (RULER's kind: a reference score); ``relative``, a share of each seed's own accuracy at its
    training length (evaluation/task_accuracy.py: relative_effective_length)."""

    absolute: float = 0.5
    relative: float = 0.9

    def titles(self) -> dict[str, str]:
        return {"absolute": f"accuracy ≥ {self.absolute:g}", "relative": f"accuracy ≥ {self.relative:g} × 1×"}


def seed_effective_lengths(entry: TaskEntry, thresholds: Thresholds) -> dict[str, dict[int, int]]:
    """{"absolute" | "relative": {train.seed: its effective length}} of an entry at no grid cell, each from the
    accuracy at the lengths that seed evaluated, in train.seed order. 0 where no evaluated length passes (the
    shortest is already below the threshold; relative: or the 1x accuracy is below the absolute one), so that a
    failing seed pulls its setting's mean down instead of leaving it; a seed that did not evaluate 1x has no
    relative one (absent)."""
    found: dict[str, dict[int, int]] = {"absolute": {}, "relative": {}}
    for seed, rows in sorted(zip(entry.seeds, entry.per_seed), key=lambda pair: pair[0]):
        curve = [(length, row.get("accuracy")) for length, row in rows.items()]
        found["absolute"][seed] = effective_length(curve, thresholds.absolute) or 0
        if entry.train_len in rows:
            relative = relative_effective_length(curve, entry.train_len, thresholds.relative, thresholds.absolute)
            found["relative"][seed] = relative or 0
    return found


def length_estimate(lengths: dict[int, int]) -> Estimate | None:
    """Mean ± CI over the seeds that have an effective length (None where none has)."""
    return mean_ci(list(lengths.values())) if lengths else None


def length_cells(entry: TaskEntry, lengths: dict[int, int]) -> tuple[Estimate | str, str]:
    """An effective length's two cells: the mean over seeds ("—" where no seed has a length that passes, "n/a"
    where none has one), and each seed's value: "—" where no evaluated length passes, "≥L" where L is the longest
    length that seed evaluated (every length passed: its effective length is at least L), "n/a" where it has none."""
    longest = {seed: max(rows, default=None) for seed, rows in zip(entry.seeds, entry.per_seed)}
    texts = [seed_length_text(lengths.get(seed), longest[seed]) for seed in sorted(entry.seeds)]
    estimate = length_estimate(lengths)
    mean = "n/a" if estimate is None else "—" if not any(lengths.values()) else estimate
    return mean, ", ".join(texts)


def seed_length_text(length: int | None, longest: int | None) -> str:
    """One seed's effective length as length_cells shows it (None: it has none; 0: no evaluated length passes)."""
    if length is None:
        return "n/a"
    if length == 0:
        return "—"
    return f"≥{length}" if length == longest else str(length)


def effective_length_report(entries: list[TaskEntry], thresholds: Thresholds) -> str:
    """The section "Effective context length": per task identity, a row per setting at no grid cell (random depth):
    each threshold's effective length, mean over seeds ± CI, and each seed's ("" where no entry is off a grid)."""
    titles = thresholds.titles()
    parts = []
    for identity, members, _ in task_tables(entries):
        rows: list[tuple[str, int, list[Estimate | None | str]]] = []
        for entry in (entry for entry in members if entry.cell is None):
            found = seed_effective_lengths(entry, thresholds)
            (absolute, absolute_seeds), (relative, relative_seeds) = (length_cells(entry, found[k]) for k in titles)
            rows.append((entry.label, len(entry.per_seed), [absolute, relative, absolute_seeds, relative_seeds]))
        if rows:
            header = [f"mean, {title}" for title in titles.values()] + [f"per seed, {t}" for t in titles.values()]
            parts += ["", f"### {identity}", "", estimate_table(rows, header, digits=0, reading=ACCURACY)]
    if not parts:
        return ""
    heading = f"## Effective context length ({'; '.join(titles.values())})"
    return "\n".join([heading, "", effective_length_intro(thresholds), *parts]) + "\n"


def effective_length_intro(thresholds: Thresholds) -> str:
    """What the section's numbers are, its thresholds named."""
    absolute, relative = f"{thresholds.absolute:g}", f"{thresholds.relative:g}"
    return (
        "A seed's effective length: the longest evaluated length up to which its accuracy (off any grid: passkey's at "
        "random depth) stays at or above the threshold at every evaluated length, the shortest included. This is "
        "RULER's effective length (Hsieh et al. 2024): the longest length before the first failure, so accuracy "
        f"that recovers at a longer length does not count. Absolute: accuracy ≥ {absolute} (--ecl-absolute). "
        f"Relative: accuracy ≥ {relative} × the seed's own accuracy at 1×, its training length (--ecl-relative); "
        f"a seed whose 1× accuracy is below {absolute} keeps nothing. Per seed, in train.seed order: — where no "
        "evaluated length passes (counted as 0 in the mean; a mean of —: no seed has one); ≥L where every evaluated "
        "length passes (the effective length is at least L, the longest evaluated); n/a: 1× not evaluated. Mean: in "
        "tokens over the seeds ± half-width of the 95% confidence interval over them (Student t; one seed: the value "
        "alone; (n=k): only k seeds have one), the highest in bold. Under each accuracy table above: eval.py's own "
        "effective length per seed (accuracy ≥ eval.task_threshold)."
    )
