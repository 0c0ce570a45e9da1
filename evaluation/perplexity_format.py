"""The rows of a run's perplexity results file (eval/extrapolation.json: perplexity, streaming and key-token rows), as
the store and the renderer take them (PERPLEXITY_ROWS: what identifies a row, how it is labelled and shown), and their
plots: perplexity by length, one line per setting (ppl_vs_length.png), and loss by position within the window
(per_position.png: nonoverlapping where evaluated, the longest length by default). evaluation/results.py describes
the rows themselves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from core.errors import PosGPTError
from evaluation.results import (
    CSV_COLUMNS,
    KEY_SETTINGS,
    KEY_TOKENS,
    ROW_REQUIRED,
    format_ppl,
    group_by_scored,
    labelled_rows,
    provenance,
    row_order,
    row_ppl,
    scored_identity,
)
from evaluation.store import RowFormat, load_document

PPL_PLOT = "ppl_vs_length.png"
PER_POSITION_PLOT = "per_position.png"


def per_position_rows(document: dict[str, Any], lengths: list[int] | None = None) -> list[dict[str, Any]]:
    """The rows per_position.png draws: nonoverlapping (where evaluated), at ``lengths`` or the longest scored.
    Rows without position bins are not drawn."""
    scored = [row for row in document["results"] if row_ppl(row) is not None and "per_position_bins" in row]
    protocol = "nonoverlapping" if any(r["protocol"] == "nonoverlapping" for r in scored) else "sliding"
    scored = [row for row in scored if row["protocol"] == protocol]
    lengths = lengths or ([max(row["length"] for row in scored)] if scored else [])
    return [row for row in scored if row["length"] in lengths]


def write_perplexity_plots(
    document: dict[str, Any], eval_dir: Path, per_position_lengths: list[int] | None
) -> dict[str, Path]:
    """ppl_vs_length.png and per_position.png of every row of the document, in ``eval_dir``."""
    from evaluation.plots import Series, bin_centre, bins_note, plot_per_position, plot_ppl_vs_length  # matplotlib

    pe, train_len = document["pe"], document["train_seq_len"]
    labelled = labelled_rows(document["results"])
    curves: dict[str, Any] = {}
    for label, row in sorted(labelled, key=lambda item: item[1]["length"]):
        if row.get("measure"):  # key-token perplexity: another measure, in the table only
            continue
        line = curves.setdefault(label, Series(label, pe, [], []))
        ppl = row_ppl(row)
        if ppl is not None and math.isfinite(ppl):  # not evaluable there, or inf (a diverged model): left out
            line.x.append(row["length"])
            line.y.append(ppl)
    plots = {
        "ppl_vs_length": plot_ppl_vs_length(
            list(curves.values()),
            {train_len},
            eval_dir / PPL_PLOT,
            f"pe={pe}: perplexity by length",
            f"trained at length {train_len} (step {document['step']}); dashed: the training length",
        )
    }
    position_rows = per_position_rows(document, per_position_lengths)
    missing = sorted(set(per_position_lengths or []) - {row["length"] for row in position_rows})
    if missing:
        print(f"eval: {PER_POSITION_PLOT} has no line at lengths {missing}: nothing was scored there", flush=True)
    labels = {id(row): label for label, row in reversed(labelled)}  # a row in several lines: its first label
    several_lengths = len({row["length"] for row in position_rows}) > 1
    position_series = [
        Series(
            labels[id(row)] + (f" L={row['length']}" if several_lengths else ""),
            pe,
            [bin_centre(*b["positions"]) for b in row["per_position_bins"] if b["loss"] is not None],
            [b["loss"] for b in row["per_position_bins"] if b["loss"] is not None],
        )
        for row in position_rows
    ]
    plots["per_position"] = plot_per_position(
        position_series,
        {train_len},
        eval_dir / PER_POSITION_PLOT,
        f"pe={pe}: loss by position",
        f"trained at length {train_len} (step {document['step']}); {bins_note(position_rows)}",
    )
    return plots


def _identity(row: dict[str, Any]) -> tuple:
    """What, besides evaluator, length, variation and temperature, identifies a perplexity row: what it scored (by
    content, split and targets), the backend and dtype, the protocol and its stride, sinks and window, and a key-token
    row's selection (None in other rows)."""

    protocol = (row["protocol"], row["stride"], row.get("sinks"), row.get("window"))
    return (scored_identity(row), *protocol, *(row.get(name) for name in KEY_SETTINGS))


def _evaluator_of(row: dict[str, Any]) -> str:
    """The evaluator of a perplexity row, from what the row measured: key-token rows say so in "measure", the
    streaming protocol's rows are the streaming evaluator's."""
    if row.get("measure") == KEY_TOKENS:
        return KEY_TOKENS
    return "streaming" if row["protocol"] == "streaming" else "perplexity"


def _checked_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row, refused where its ppl is neither a number nor null."""
    if not (row["ppl"] is None or isinstance(row["ppl"], (int, float))):
        raise PosGPTError(f"a row at length {row['length']} has a non-numeric ppl ({row['ppl']!r})")
    return row


def _describe(row: dict[str, Any]) -> str:
    where = provenance(row)
    return f"data {where['data']}, {where['corpus']}, {where['split']}, the same targets, backend, dtype and settings; "


def _notes(document: dict[str, Any], lines: dict[str, dict[int, dict[str, Any]]]) -> str:
    """What the cells scored: one target range for all, or what differs between lines."""
    rows = document["results"]
    if len(group_by_scored(rows)) > 1:
        return (
            "(each line's cells score the same targets; [...] says what differs between lines: the data, its "
            "content (corpus digest), split or targets, or the attention backend or dtype)"
        )
    spans = {tuple(row["target_range"]) for row in rows if row.get("target_range")}  # one group: one at most
    if not spans:
        return "(no length could be scored: extrapolation.json gives each row's reason)"
    start, stop = next(iter(spans))
    return f"(each cell scores the same targets: [{start}, {stop}))"


def _summary(document: dict[str, Any]) -> dict[str, float]:
    """ppl per setting and length (the finite ones)."""
    values = {}
    for label, row in labelled_rows(document["results"]):
        ppl = row_ppl(row)
        if ppl is not None and math.isfinite(ppl):
            values[f"{label}/ppl@{row['length']}"] = ppl
    return values


PERPLEXITY_ROWS = RowFormat(
    file="extrapolation",
    value="ppl",
    columns=tuple(CSV_COLUMNS),
    identity=_identity,
    sort=row_order,
    labels=lambda rows: labelled_rows(sorted(rows, key=row_order)),
    cell=lambda row: format_ppl(row_ppl(row)),
    title=lambda document: f"pe={document['pe']} ppl",
    notes=_notes,
    plots=lambda document, eval_dir, options: write_perplexity_plots(
        document, eval_dir, options.get("per_position_plot_lengths")
    ),
    summary=_summary,
    evaluator_of=_evaluator_of,
    values=lambda row: {"ppl": row_ppl(row)},
    describe=_describe,
    required=ROW_REQUIRED,
    check=_checked_row,
)


def load_results(eval_dir: str | Path) -> dict[str, Any] | None:
    """The perplexity document in ``eval_dir`` (extrapolation.json), or None when there is none; a damaged or
    malformed one is a PosGPTError that names the file."""
    return load_document(eval_dir, PERPLEXITY_ROWS)
