"""Tables of estimates over seeds, and the two ways posgpt claims a difference, shared by every report.

A cell is the mean over seeds ± the half-width of its 95% Student-t interval (evaluation/stats.py), the best
mean of each column in bold. Differences: two settings differ at a column when their intervals do not overlap
(``differences``, conservative), or, paired by seed, when the interval of the per-seed ratio − 1 (perplexity) or
difference (accuracy) excludes 0 (``paired_report``: runs with the same train.seed train on the same batches).
Reading says which end of a measure is best and how two of its values are paired.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import PosGPTError
from core.text import markdown_text
from evaluation.render import render_table
from evaluation.results import format_estimate
from evaluation.stats import Estimate, clearly_different, mean_ci
from reports.runs import Entry


@dataclass(frozen=True)
class Reading:
    """How a measure's values are compared: which end of a column is best (``best``: min or max, named by
    ``best_word``), and how two settings' values of one seed are paired: ``ratio``, value / reference − 1
    (perplexity: a scale), or else the difference value − reference (accuracy: a share, often 0)."""

    best: Callable[..., Any] = min
    best_word: str = "lowest"
    ratio: bool = True


PERPLEXITY = Reading()


ACCURACY = Reading(max, "highest", ratio=False)  # also the mean log-probability: higher is better


def told_apart_by_training_length(entries: list[Entry]) -> int | None:
    """The training length every entry shares (the length header then prints each column's multiple of it); where
    they differ, None, and each entry's label gains its own (" (trained at N)"), so that settings trained at other
    lengths never read as one. A --baseline is found by its label before this."""
    train_lens = {entry.train_len for entry in entries}
    if len(train_lens) == 1:
        return next(iter(train_lens))
    for entry in entries:
        entry.label += f" (trained at {entry.train_len})"
    return None


def paired_estimate(
    entry: Entry,
    reference: Entry,
    column: Any,
    values: Callable[[Entry, Any], dict[int, float]],
    reading: Reading = PERPLEXITY,
) -> Estimate | None:
    """Mean ± CI over the seeds both settings ran of entry's value / reference's value − 1 (or their difference:
    Reading). Runs with the same train.seed train on the same batches (the same tokens in the same order:
    training/batch_stream.py draws them from a generator of their own; a task's examples likewise), so pairing
    cancels what the choice of training data does to both. None with fewer than two shared seeds. A seed where
    both are inf (both diverged) has no ratio."""
    own, theirs = values(entry, column), values(reference, column)
    shared = sorted(seed for seed in set(own) & set(theirs) if not (math.isinf(own[seed]) and math.isinf(theirs[seed])))
    if len(shared) < 2:
        return None
    if reading.ratio:
        return mean_ci([own[seed] / theirs[seed] - 1 for seed in shared])
    return mean_ci([own[seed] - theirs[seed] for seed in shared])


def find_baseline(entries: list[Entry], label: str | None) -> Entry | None:
    """The entry labelled ``label`` (None: no baseline); a PosGPTError listing the labels when there is none, or
    when it has one seed."""
    if label is None:
        return None
    baseline = next((entry for entry in entries if entry.label == label), None)
    if baseline is None:
        raise PosGPTError(
            f"--baseline {label!r} is not a setting of these runs; they are: "
            f"{', '.join(repr(entry.label) for entry in entries)}"
        )
    if len(baseline.per_seed) < 2:
        raise PosGPTError(f"--baseline {label!r} has one seed: there is nothing to pair by seed")
    return baseline


def paired_report(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    values: Callable[[Entry, Any], dict[int, float]],
    baseline: Entry | None = None,
    reading: Reading = PERPLEXITY,
) -> list[str]:
    """Per column, every setting against a reference, paired by seed: a table of the relative difference (or the
    difference: Reading; mean ± 95% CI over shared seeds) and, per column, which exceed their interval. The
    reference is ``baseline`` or else, per column, the best mean (lowest perplexity, highest accuracy) among the
    settings with at least two seeds (one seed cannot be paired)."""
    body, claims = [[entry.label] for entry in entries], []
    best = reading.best_word
    for column, title in zip(columns, header):
        means = {id(entry): mean_ci(list(v.values())).mean for entry in entries if len(v := values(entry, column)) > 1}
        if len(means) < 2 or (baseline is not None and id(baseline) not in means):
            for row in body:
                row.append("-")
            continue
        reference = baseline or next(entry for entry in entries if means.get(id(entry)) == reading.best(means.values()))
        worse, close = [], []
        for entry, row in zip(entries, body):
            if entry is reference:
                row.append("baseline" if baseline else best)
                continue
            estimate = paired_estimate(entry, reference, column, values, reading)
            if estimate is None:
                row.append("-")
                continue
            apart = estimate.low > 0 or estimate.high < 0
            (worse if apart else close).append(entry.label)
            bold = "**" if apart else ""
            if reading.ratio:
                row.append(f"{bold}{estimate.mean:+.1%} ± {estimate.half_width:.1%}{bold}")
            else:
                row.append(f"{bold}{estimate.mean:+.3f} ± {estimate.half_width:.3f}{bold}")
        claims.append(
            f"- {title}: {'baseline' if baseline else best} {markdown_text(reference.label)}; interval excludes 0 "
            f"(clearly different): {listed(worse)}; interval includes 0: {listed(close)}"
        )
    reference_text = f"the baseline's ({markdown_text(baseline.label)})" if baseline else f"the {best} setting's"
    contrast = f"/ {reference_text} value − 1" if reading.ratio else f"− {reference_text} value"
    return [
        "",
        "Paired by seed (runs with the same train.seed train on the same batches): per "
        f"seed, a setting's value {contrast}, mean over the shared seeds ± 95% CI; "
        "bold where the interval excludes 0.",
        "",
        render_table(["setting"] + header, body, markdown=True),
        "",
        *claims,
    ]


def estimate_table(
    rows: list[tuple[str, int, list[Estimate | None | str]]],
    header: list[str],
    digits: int = 2,
    reading: Reading = PERPLEXITY,
    classes: list[int] | None = None,
) -> str:
    """A markdown table: a row per (label, number of seeds, cells), the best (lowest: Reading) mean of each column
    in bold. A cell is an Estimate, None (n/a: not evaluable there) or a string shown as is ("-": not evaluated).
    ``classes``: per row, which rows scored the same tokens (token_class_ids); a best is marked only among rows of
    one class, and where the table holds several, only in a class of two rows or more: a row alone on its tokens
    is the best of nothing."""
    classes = classes or [0] * len(rows)
    several = len(set(classes)) > 1
    marked: list[set[int]] = []  # per column, the rows in bold
    for i in range(len(header)):
        by_class: dict[int, list[tuple[float, int]]] = {}
        for r, (_, _, cells) in enumerate(rows):
            if isinstance(cells[i], Estimate):
                by_class.setdefault(classes[r], []).append((cells[i].mean, r))
        bests = [
            {r for mean, r in members if mean == reading.best(m for m, _ in members)}
            for members in by_class.values()
            if len(members) > 1 or not several
        ]
        marked.append(set().union(*bests))
    body = []
    for r, (label, seeds, cells) in enumerate(rows):
        texts = []
        for i, cell in enumerate(cells):
            text = cell if isinstance(cell, str) else format_estimate(cell, seeds, digits)
            texts.append(f"**{text}**" if r in marked[i] else text)
        body.append([label, str(seeds)] + texts)
    return render_table(["setting", "seeds"] + header, body, markdown=True)


def token_class_ids(entries: list[Entry]) -> list[int]:
    """Per entry, the index of its class of entries that scored the same tokens (Entry.same_tokens), the classes
    numbered in order of first appearance."""
    firsts: list[Entry] = []
    ids = []
    for entry in entries:
        home = next((i for i, first in enumerate(firsts) if first.same_tokens(entry)), None)
        if home is None:
            firsts.append(entry)
            home = len(firsts) - 1
        ids.append(home)
    return ids


def table(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    estimate: Callable[[Entry, Any], Estimate | None],
    digits: int = 2,
    reading: Reading = PERPLEXITY,
) -> str:
    """A row per entry: its number of seeds and, per column, the estimate ("-" where no seed was evaluated); the
    best of each column marked among the entries that scored the same tokens."""
    rows = [
        (
            entry.label,
            len(entry.per_seed),
            [
                estimate(entry, column) if any(column_key(column, entry) in seed for seed in entry.per_seed) else "-"
                for column in columns
            ],
        )
        for entry in entries
    ]
    return estimate_table(rows, header, digits, reading, token_class_ids(entries))


def column_key(column: Any, entry: Entry) -> int:
    """The length a column reads in an entry's rows: a length, or a multiple of the entry's training length."""
    return column if isinstance(column, int) else round(column * entry.train_len)


def listed(labels: list[str]) -> str:
    """Labels in a line of a report, shown literally (core.text), or "no setting"."""
    return ", ".join(map(markdown_text, labels)) or "no setting"


def differences(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    estimate: Callable[[Entry, Any], Estimate | None],
    reading: Reading = PERPLEXITY,
) -> list[str]:
    """Per column: which settings' 95% intervals do not overlap the best one's (the rule in docs/evaluation.md)."""
    lines = []
    word = reading.best_word
    for column, title in zip(columns, header):
        scored = [(entry, estimate(entry, column)) for entry in entries]
        scored = [(entry, value) for entry, value in scored if value is not None]
        if len(scored) < 2:
            continue
        best_entry, best = reading.best(scored, key=lambda item: item[1].mean)
        if best.half_width is None:
            lines.append(
                f"- {title}: {word} {markdown_text(best_entry.label)}, one seed: no interval, no difference claimed"
            )
            continue
        worse = [e.label for e, v in scored if e is not best_entry and clearly_different(v, best)]
        close = [
            e.label
            for e, v in scored
            if e is not best_entry and v.half_width is not None and not clearly_different(v, best)
        ]
        unseeded = [e.label for e, v in scored if v.half_width is None]
        parts = [
            f"{word} {markdown_text(best_entry.label)}",
            f"intervals apart (clearly worse): {listed(worse)}",
            f"intervals overlap (not distinguishable): {listed(close)}",
        ]
        if unseeded:
            parts.append(f"one seed, not compared: {listed(unseeded)}")
        lines.append(f"- {title}: " + "; ".join(parts))
    return lines
