"""Perplexity over seeds: the rows of extrapolation.json pooled into entries, the markdown report, and the
series its plots draw (perplexity vs length, loss by position).

Rows are pooled only where they scored the same thing and were computed alike (evaluation/results.py's
group_by_scored: corpus content, split, targets, backend, dtype); otherwise they are entries of their own,
labelled by what differs (tag_entries), and differences are claimed only between entries that scored the same
tokens (token_classes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from core.errors import PosGPTError
from evaluation.extrapolation import effective_stride
from evaluation.plots import Series, bin_centre
from evaluation.render import length_header
from evaluation.results import (
    RUNTIME_FIELDS,
    SCORED_FIELDS,
    group_by_scored,
    key_label,
    provenance,
    provenance_tags,
    row_ppl,
)
from evaluation.stats import Estimate, mean_ci
from reports.runs import Entry, Run, evaluated_with, group_labels
from reports.tables import differences, listed, paired_report, table, token_class_ids, told_apart_by_training_length


def choose_data(runs: list[Run], data: str | None) -> str:
    available = sorted({str(row.get("data")) for run in runs for row in run.document["results"]})
    if data is None and len(available) == 1:
        return available[0]
    if data not in available:
        raise PosGPTError(f"choose the data to compare with --data (results exist for {', '.join(available)})")
    return data


def entries_of(
    groups: list[list[Run]], protocol: str, stride: int | None, data: str, measure: str | None = None
) -> list[Entry]:
    """One entry per (setting, variation, what was scored): the rows of the chosen protocol and data, pooled over
    the setting's seeds only where they scored the same tokens with the same backend and dtype (results.py's
    group_by_scored), so a seed that scored something else is an entry of its own, never averaged in. Entries
    are labelled by what differs (tag_entries). ``measure``: plain perplexity (None), or the rows of another
    measure (results.py's KEY_TOKENS), pooled only where they were selected alike (key_label)."""
    entries = []
    for group, label in zip(groups, group_labels(groups)):
        cells: dict[tuple, dict[int, dict[int, dict[str, Any]]]] = {}  # (variation, scored) -> run -> length -> row
        for i, run in enumerate(group):
            rows = [row for row in run.document["results"] if _wanted(row, protocol, stride, data, measure)]
            for scored, members in group_by_scored(rows).items():
                for row in members:
                    # the streaming protocol's sinks (--protocol streaming), the variation, the temperature
                    sinks = f"k={row['sinks']}" if row.get("sinks") is not None else ""
                    key = (" ".join(filter(None, (sinks, key_label(row), evaluated_with(row, run)))), scored)
                    cells.setdefault(key, {}).setdefault(i, {})[row["length"]] = row
        if not cells:  # shown as a row of "-" rather than silently left out
            cells[("", None)] = {i: {} for i in range(len(group))}
        document = group[0].document
        for (variation, scored), by_run in sorted(cells.items(), key=lambda item: (item[0][0] != "", item[0][0])):
            runs = sorted(by_run)
            entries.append(
                Entry(
                    label + (f" {variation}" if variation else ""),
                    document["pe"],
                    document["train_seq_len"],
                    [by_run[i] for i in runs],
                    [group[i].config["train"]["seed"] for i in runs],
                    scored,
                )
            )
    if not any(seed for entry in entries for seed in entry.per_seed):
        raise PosGPTError(f"no {protocol} results on data {data} in these runs (try --protocol or --stride)")
    tag_entries(entries)
    return entries


def _wanted(row: dict[str, Any], protocol: str, stride: int | None, data: str, measure: str | None = None) -> bool:
    wanted_stride = effective_stride(row["length"], stride) if protocol == "sliding" else None
    chosen = row["protocol"] == protocol and row["stride"] == wanted_stride and str(row.get("data")) == data
    return chosen and row.get("measure") == measure


def tag_entries(entries: list[Entry]) -> None:
    """Add "[...]" to the labels of entries that scored other tokens than the rest of the table (corpus
    content, split, targets), or that were computed otherwise (backend, dtype) than other entries of the same
    setting: what tells them apart, so no reader takes them for one measurement."""
    shown = [entry for entry in entries if entry.example() is not None]
    examples = [entry.example() for entry in shown]
    scored_tags = provenance_tags(examples, SCORED_FIELDS)
    runtime_tags = [""] * len(shown)
    for label in {entry.label for entry in shown}:
        same = [i for i, entry in enumerate(shown) if entry.label == label]
        for i, tag in zip(same, provenance_tags([examples[i] for i in same], RUNTIME_FIELDS)):
            runtime_tags[i] = tag
    for entry, *tags in zip(shown, scored_tags, runtime_tags):
        tag = " ".join(t for t in tags if t)
        entry.label += f" [{tag}]" if tag else ""


def runtime_note(entries: list[Entry]) -> str | None:
    """Which attention backend and dtype computed the rows, by setting where they differ; None when no row
    records them."""
    by_runtime: dict[str, list[str]] = {}
    for entry in entries:
        example = entry.example()
        if example is not None and (example.get("attn_backend") or example.get("dtype")):
            where = provenance(example)
            by_runtime.setdefault(f"{where['backend']}, {where['dtype']}", []).append(entry.label)
    if not by_runtime:
        return None
    if len(by_runtime) == 1:
        return f"Attention backend and dtype: {next(iter(by_runtime))} for every row."
    return (
        "Attention backend and dtype: "
        + "; ".join(f"{runtime} ({listed(labels)})" for runtime, labels in by_runtime.items())
        + ". A setting's seeds computed otherwise are separate rows, never averaged."
    )


def token_classes(entries: list[Entry]) -> list[list[Entry]]:
    """The entries in classes that scored the same tokens (Entry.same_tokens), in order of first appearance:
    differences and paired ratios are only computed within a class."""
    ids = token_class_ids(entries)
    return [[entry for entry, own in zip(entries, ids) if own == i] for i in range(max(ids, default=-1) + 1)]


def ppl_values(entry: Entry, length: int) -> dict[int, float]:
    """{train.seed: perplexity at ``length``} over the seeds that have one there."""
    return {
        seed: row_ppl(rows[length])
        for seed, rows in zip(entry.seeds, entry.per_seed)
        if length in rows and row_ppl(rows[length]) is not None
    }


def ratio_values(entry: Entry, multiple: float) -> dict[int, float]:
    """{train.seed: ppl@kL / ppl@L}, each seed's ratio from its own two perplexities (none where ppl@L is inf:
    a seed diverged at its own length has no ratio)."""
    length = round(multiple * entry.train_len)
    ratios = {}
    for seed, rows in zip(entry.seeds, entry.per_seed):
        if length in rows and entry.train_len in rows:
            ppl, base = row_ppl(rows[length]), row_ppl(rows[entry.train_len])
            if ppl is not None and base is not None and math.isfinite(base):
                ratios[seed] = ppl / base
    return ratios


def ppl_estimate(entry: Entry, length: int) -> Estimate | None:
    """Mean ± CI of the perplexity at ``length`` over the seeds that have one there."""
    values = ppl_values(entry, length)
    return mean_ci(list(values.values())) if values else None


def ratio_estimate(entry: Entry, multiple: float) -> Estimate | None:
    """Mean ± CI over seeds of ppl@kL / ppl@L."""
    values = ratio_values(entry, multiple)
    return mean_ci(list(values.values())) if values else None


# The rule by which the report claims a difference, said once under each table of differences.
DIFFERENCES_RULE = (
    "Differences: a setting differs from the lowest one at a length when their 95% intervals do not "
    "overlap (a conservative rule)."
)


def markdown_report(
    entries: list[Entry], protocol: str, stride: int | None, data: str, ratios: bool, baseline: Entry | None = None
) -> str:
    lengths = sorted({length for entry in entries for seed in entry.per_seed for length in seed})
    common_train_len = told_apart_by_training_length(entries)
    header = length_header(lengths, common_train_len)
    stride_note = f", stride {stride or 'L/2'}" if protocol == "sliding" else ""
    classes = token_classes(entries)
    parts = [
        f"Perplexity by evaluation length ({protocol} protocol{stride_note}; data: {data}; "
        f"training length {common_train_len or 'per row'}): mean over seeds ± half-width of the 95% confidence "
        "interval (Student t, n−1 degrees of freedom; one seed: the value alone; (n=k): only k seeds have "
        "a value there). n/a: not evaluable there (the run's extrapolation.json says why).",
        "",
        table(entries, lengths, header, ppl_estimate),
        "",
        f"Scored tokens: {scored_tokens_note(entries, classes)}.",
    ]
    note = runtime_note(entries)
    if note:
        parts += ["", note]
    if any(len(entry.per_seed) > 1 for entry in entries):
        parts += ["", DIFFERENCES_RULE, *by_class(classes, lambda c: differences(c, lengths, header, ppl_estimate))]
        parts += by_class(classes, lambda c: paired_report(c, lengths, header, ppl_values, baseline_in(c, baseline)))
    else:
        parts += [
            "",
            "One seed per setting: no intervals, so no difference is claimed (train more seeds, e.g. "
            "train.seed=1,2,3).",
        ]
    if ratios:
        parts += ratio_report(entries, classes, baseline)
    return "\n".join(parts) + "\n"


def scored_tokens_note(entries: list[Entry], classes: list[list[Entry]]) -> str:
    """Which tokens the cells scored: the same ones everywhere, or, in bold, where they differ."""
    rows = [row for entry in entries for seed in entry.per_seed for row in seed.values() if row_ppl(row) is not None]
    ranges = {tuple(row["target_range"]) + (row["tokens"],) for row in rows}
    if len(classes) > 1:
        return (
            "**rows marked [...] scored other tokens** (another corpus, split or target range): each is its own "
            "row, never averaged with the others; the lowest is marked, and differences are claimed, only among "
            "rows that scored the same tokens"
        )
    if len(ranges) == 1:
        start, stop, tokens = next(iter(ranges))
        return f"every cell scores the same {tokens:,} tokens (targets [{start:,}, {stop:,}) of the split)"
    return (
        "**cells scored different token ranges** "
        f"({', '.join(f'[{a:,}, {b:,})' for a, b, _ in sorted(ranges))}): compare with care"
    )


def ratio_report(entries: list[Entry], classes: list[list[Entry]], baseline: Entry | None) -> list[str]:
    """The lines of the extrapolation-ratio table (ppl@kL / ppl@L), with its differences when there are seeds."""
    multiples = sorted(
        {
            length / entry.train_len
            for entry in entries
            for seed in entry.per_seed
            for length in seed
            if length > entry.train_len
        }
    )
    ratio_header = [f"{k:g}×" for k in multiples]
    parts = [
        "",
        "Extrapolation ratio ppl@kL / ppl@L (L: the training length; per seed, then mean ± 95% CI):",
        "",
        table(entries, multiples, ratio_header, ratio_estimate, digits=3),
    ]
    if any(len(entry.per_seed) > 1 for entry in entries):
        parts += [
            "",
            DIFFERENCES_RULE.replace("at a length", "at a multiple"),
            *by_class(classes, lambda c: differences(c, multiples, ratio_header, ratio_estimate)),
        ]
        parts += by_class(
            classes, lambda c: paired_report(c, multiples, ratio_header, ratio_values, baseline_in(c, baseline))
        )
    return parts


def by_class(classes: list[list[Entry]], report: Callable[[list[Entry]], list[str]]) -> list[str]:
    """``report`` of each class of entries that scored the same tokens (token_classes); headed by what the
    class scored where there are several."""
    if len(classes) == 1:
        return report(classes[0])
    lines = []
    for members in (members for members in classes if len(members) > 1):
        lines += ["", f"Among the rows that scored the tokens of {listed([entry.label for entry in members])}:"]
        lines += report(members)
    alone = [members[0].label for members in classes if len(members) == 1]
    if alone:
        lines += ["", f"Not compared (no other row scored their tokens): {listed(alone)}."]
    return lines


def baseline_in(members: list[Entry], baseline: Entry | None) -> Entry | None:
    """The baseline where it is among ``members``; else None (the lowest of the class is the reference)."""
    return baseline if any(entry is baseline for entry in members) else None


def ppl_series(entries: list[Entry]) -> list[Series]:
    series = []
    for entry in entries:
        lengths = sorted({length for seed in entry.per_seed for length in seed})
        points = [  # an inf mean (a diverged seed) cannot be drawn: left out of the line, shown in the table
            (length, value)
            for length in lengths
            if (value := ppl_estimate(entry, length)) is not None and math.isfinite(value.mean)
        ]
        series.append(
            Series(
                entry.label,
                entry.scheme,
                [p[0] for p in points],
                [p[1].mean for p in points],
                [p[1].half_width for p in points],
            )
        )
    return series


def per_position_series(entries: list[Entry], length: int) -> list[Series]:
    """Per entry with rows at ``length``: per-bin mean loss over seeds, with its CI as the band."""
    series = []
    for entry in entries:
        rows = [seed[length] for seed in entry.per_seed if length in seed and row_ppl(seed[length]) is not None]
        if not rows:
            continue
        if any("per_position_bins" not in row for row in rows):
            raise PosGPTError(
                f"{entry.label}: results without per_position_bins (from an older posgpt); "
                "evaluate the runs again with eval.py"
            )
        bins = [[(b["positions"], b["loss"]) for b in row["per_position_bins"]] for row in rows]
        if any([p for p, _ in seed] != [p for p, _ in bins[0]] for seed in bins):
            raise PosGPTError(f"{entry.label}: the seeds' position bins differ (evaluated with other settings)")
        x, y, widths = [], [], []
        for i, (positions, _) in enumerate(bins[0]):
            losses = [seed[i][1] for seed in bins if seed[i][1] is not None]
            if losses:
                estimate = mean_ci(losses)
                x.append(bin_centre(*positions))
                y.append(estimate.mean)
                widths.append(estimate.half_width)
        series.append(Series(entry.label, entry.scheme, x, y, widths))
    return series


def longest_evaluated_length(entries: list[Entry]) -> int | None:
    """The longest length any entry has a perplexity at (entries that cannot run there are left out)."""
    lengths = [L for entry in entries for seed in entry.per_seed for L, row in seed.items() if row_ppl(row) is not None]
    return max(lengths, default=None)
