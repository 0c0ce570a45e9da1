"""Key-token perplexity (LongPPL, evaluation/key_tokens.py) over seeds: its own section of the comparison.

The rows of the protocol and data compared whose ``measure`` is key tokens are pooled into entries as perplexity
rows are (reports/perplexity.py's entries_of: over a setting's seeds where they scored the same targets, with the
same backend and dtype, and here also selected alike: the thresholds, the short context, the evaluator). The
section holds the key-token perplexity by length (mean ± 95% CI over seeds, the lowest in bold) with the same
differences and paired-by-seed report as perplexity, then the share of the targets that were key tokens.
"""

from __future__ import annotations

from typing import Any

from evaluation.extrapolation import effective_stride
from evaluation.key_tokens import SELF
from evaluation.render import length_header
from evaluation.results import KEY_TOKENS, key_label
from evaluation.stats import Estimate, mean_ci
from reports.perplexity import (
    DIFFERENCES_RULE,
    baseline_in,
    by_class,
    entries_of,
    ppl_estimate,
    ppl_values,
    token_classes,
)
from reports.runs import Entry, Run
from reports.tables import Reading, differences, paired_report, table, told_apart_by_training_length

SHARE = Reading(max, "most", ratio=False)  # the share of key tokens: no end is better; bold marks the most


def key_token_entries(groups: list[list[Run]], protocol: str, stride: int | None, data: str) -> list[Entry]:
    """The key-token entries of the compared protocol and data ([] when no run has such rows there), labelled by
    their setting alone when every entry was selected alike (the selection is then named in the heading)."""
    if not any(_is_key_row(row, protocol, stride, data) for group in groups for run in group for row in _rows(run)):
        return []
    entries = [entry for entry in entries_of(groups, protocol, stride, data, KEY_TOKENS) if entry.example()]
    selections = {key_label(entry.example()) for entry in entries}
    if len(selections) == 1:
        common = f" {next(iter(selections))}"
        for entry in entries:
            entry.label = entry.label.replace(common, "", 1)
    return entries


def _rows(run: Run) -> list[dict[str, Any]]:
    return run.document["results"] if run.document else []


def _is_key_row(row: dict[str, Any], protocol: str, stride: int | None, data: str) -> bool:
    """A key-token row of the protocol, sliding stride and data compared."""
    wanted_stride = effective_stride(row["length"], stride) if protocol == "sliding" else None
    same = (row["protocol"], row["stride"], str(row.get("data"))) == (protocol, wanted_stride, data)
    return same and row.get("measure") == KEY_TOKENS


def share_values(entry: Entry, length: int) -> dict[int, float]:
    """{train.seed: key tokens as a percentage of the targets at ``length``} over the seeds with a row there."""
    return {
        seed: 100 * rows[length]["key_share"]
        for seed, rows in zip(entry.seeds, entry.per_seed)
        if length in rows and rows[length].get("key_share") is not None
    }


def share_estimate(entry: Entry, length: int) -> Estimate | None:
    values = share_values(entry, length)
    return mean_ci(list(values.values())) if values else None


def key_token_report(entries: list[Entry], protocol: str, baseline_label: str | None = None) -> str:
    """The markdown section: the selection, the key-token perplexity table with its differences and pairing, and
    the share of key tokens."""
    lengths = sorted({length for entry in entries for seed in entry.per_seed for length in seed})
    baseline = next((entry for entry in entries if entry.label == baseline_label), None)  # by the label given
    header = length_header(lengths, told_apart_by_training_length(entries))
    selections = sorted({key_label(entry.example()) for entry in entries})
    selection = selections[0] if len(selections) == 1 else "selected as each row's label says"
    evaluators = {entry.example().get("key_evaluator") for entry in entries}
    parts = [
        "",
        f"## Key-token perplexity (LongPPL, {protocol} protocol)",
        "",
        f"Perplexity over the key tokens only, {selection}: the targets whose log-probability the evaluator finds "
        "more than α nats higher with the long context than with the short one (its tokens: short length/stride), "
        "and above β with it. Mean over seeds ± half-width of the 95% confidence interval; n/a: no key token there.",
    ]
    if SELF in evaluators:
        parts.append(
            "Evaluator self: each run selected its own key tokens, so rows average over different tokens (and a "
            "run's own key tokens have loss below −β); name one evaluator (eval.key_evaluator) for one set."
        )
    parts += ["", table(entries, lengths, header, ppl_estimate)]
    classes = token_classes(entries)
    if any(len(entry.per_seed) > 1 for entry in entries):
        baseline = baseline if baseline is not None and len(baseline.per_seed) > 1 else None
        parts += ["", DIFFERENCES_RULE, *by_class(classes, lambda c: differences(c, lengths, header, ppl_estimate))]
        parts += by_class(classes, lambda c: paired_report(c, lengths, header, ppl_values, baseline_in(c, baseline)))
    parts += [
        "",
        f"Key tokens, % of the scored targets (mean over seeds ± 95% CI; {key_count_note(entries)}):",
        "",
        table(entries, lengths, header, share_estimate, digits=1, reading=SHARE),
    ]
    return "\n".join(parts) + "\n"


def key_count_note(entries: list[Entry]) -> str:
    """How many targets the shares are of, and the range of key tokens found per row."""
    rows = [row for entry in entries for seed in entry.per_seed for row in seed.values() if row.get("target_range")]
    spans = {row["target_range"][1] - row["target_range"][0] for row in rows}
    found = [row["tokens"] for row in rows]
    targets = f"{next(iter(spans)):,} targets" if len(spans) == 1 else "targets per row"
    return f"of {targets}; {min(found, default=0):,}–{max(found, default=0):,} key tokens per row and seed"
