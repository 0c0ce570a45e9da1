"""The rows of plug-in evaluators over seeds (those with a format of their own, such as evaluation/value_format.py's):
a section each in compare.py's report, after the built-in ones.

A run's rows of such an evaluator are read from its eval/<file>.json by the one reader (evaluation/store.py); a
setting's seeds are pooled per variation, and each cell is the mean ± the half-width of the 95% CI over them, the
best of a column marked (the format says which end is best).
"""

from __future__ import annotations

from typing import Any

from core.rundir import EVAL_DIR
from evaluation.evaluator import EVALUATORS, registered
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import length_header
from evaluation.results import condition_label
from evaluation.stats import Estimate, mean_ci
from evaluation.store import RowFormat, load_document
from evaluation.task_accuracy import TASK_ROWS
from reports.runs import Entry, Run, group_by_seed, group_labels
from reports.tables import ACCURACY, PERPLEXITY, table, told_apart_by_training_length


def plugin_formats() -> dict[str, RowFormat]:
    """The formats of the registered evaluators that the built-in sections do not show, by file."""
    registered()
    built_in = (PERPLEXITY_ROWS, TASK_ROWS)
    return {cls.rows.file: cls.rows for cls in EVALUATORS.values() if cls.rows not in built_in}


def metric_entries(runs: list[Run], rows: RowFormat) -> list[Entry]:
    """An entry per (setting, variation) whose runs have rows of the format: {length: row} per seed."""
    groups = group_by_seed(runs)
    entries = []
    for group, label in zip(groups, group_labels(groups)):
        by_variation: dict[str, Entry] = {}
        for run in group:
            document = load_document(run.dir / EVAL_DIR, rows)
            if document is None:
                continue
            cells: dict[str, dict[int, dict[str, Any]]] = {}
            for row in document["results"]:
                cells.setdefault(condition_label(row), {})[row["length"]] = row
            for variation, by_length in cells.items():
                name = " ".join(filter(None, (label, variation)))
                entry = by_variation.setdefault(variation, Entry(name, run.pe, document["train_seq_len"]))
                entry.per_seed.append(by_length)
                entry.seeds.append(run.config["train"]["seed"])
        entries += by_variation.values()
    return entries


def metric_report(runs: list[Run]) -> str:
    """A markdown section per plug-in evaluator the runs have rows of ("" where they have none)."""
    sections = []
    for rows in plugin_formats().values():
        entries = metric_entries(runs, rows)
        if not entries:
            continue
        lengths = sorted({length for entry in entries for seed in entry.per_seed for length in seed})
        header = length_header(lengths, told_apart_by_training_length(entries))

        def estimate(entry: Entry, length: int, value: str = rows.value) -> Estimate | None:
            values = [seed[length][value] for seed in entry.per_seed if seed.get(length, {}).get(value) is not None]
            return mean_ci(values) if values else None

        reading = ACCURACY if rows.higher_is_better else PERPLEXITY
        sections += [
            "",
            f"## {rows.value} (eval/{rows.json_file})",
            "",
            "Mean over seeds ± half-width of the 95% confidence interval; the "
            f"{reading.best_word} of a column in bold.",
            "",
            table(entries, lengths, header, estimate, digits=4, reading=reading),
        ]
    return "\n".join(sections) + ("\n" if sections else "")
