"""The one renderer of a results file: its CSV, its console table, its plots and its W&B log, for every evaluator.

What differs between evaluators is declared in their RowFormat (evaluation/store.py): the columns, each row's
line label and cell text, the notes under the table, the plots, the summary values. The layout is the same for
all: a line per label, a column per evaluated length (with its multiple of the training length), '-' where a line
has no row at a length.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from core.files import atomic_write
from core.text import markdown_text
from evaluation.store import RowFormat
from model.temperature import temperature_label


def csv_rows(document: dict[str, Any], rows: RowFormat) -> list[dict[str, Any]]:
    """The rows as flat records with the format's columns (the variation and temperature by their labels)."""
    return [
        {
            **{column: row.get(column) for column in rows.columns},
            "multiple": round(row["length"] / document["train_seq_len"], 4),
            "attn_temperature": temperature_label(row.get("attn_temperature")),
            **rows.values(row),
        }
        for row in document["results"]
    ]


def write_csv(document: dict[str, Any], path: str | Path, rows: RowFormat) -> Path:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows.columns))
    writer.writeheader()
    writer.writerows(csv_rows(document, rows))
    return atomic_write(path, text.getvalue())


def length_header(lengths: list[int], train_len: int | None) -> list[str]:
    """Column titles: each length and, when the runs share one training length, its multiple of it."""
    return [f"{L}" + (f" ({L / train_len:g}×)" if train_len else "") for L in lengths]


def render_table(header: list[str], body: list[list[str]], markdown: bool = False) -> str:
    """The one results-table layout: the first column left-aligned labels, the others right-aligned values,
    as aligned plain text (eval.py's console table) or as a markdown table (scripts/compare.py)."""
    if markdown:  # the labels and titles come from data (a run's name): shown literally (core.text)
        return "\n".join(
            ["| " + " | ".join(map(markdown_text, header)) + " |", "|---|" + "---:|" * (len(header) - 1)]
            + ["| " + " | ".join([markdown_text(line[0]), *line[1:]]) + " |" for line in body]
        )
    lines = [header] + body
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
        for line in lines
    )


def format_table(document: dict[str, Any], rows: RowFormat) -> str:
    """Lines: the format's labels; columns: the lengths and their multiple of the training length; then the
    format's notes (what the cells scored, further tables)."""
    lines: dict[str, dict[int, dict[str, Any]]] = {}
    for label, row in rows.labels(document["results"]):
        lines.setdefault(label, {})[row["length"]] = row
    lengths = sorted({row["length"] for row in document["results"]})
    header = [rows.title(document)] + length_header(lengths, document["train_seq_len"])
    body = [[label] + [rows.cell(cells[L]) if L in cells else "-" for L in lengths] for label, cells in lines.items()]
    notes = rows.notes(document, lines)
    return render_table(header, body) + (f"\n{notes}" if notes else "")


def write_plots(document: dict[str, Any], eval_dir: Path, rows: RowFormat, options: dict[str, Any]) -> dict[str, Path]:
    """The format's plots of every row of the document, in ``eval_dir``."""
    return rows.plots(document, eval_dir, options)


def log_to_wandb(wandb_run: Any, document: dict[str, Any], rows: RowFormat, plots: dict[str, Path]) -> None:
    """The whole table (every accumulated row), the plots, and the format's values in the run's summary."""
    import wandb

    table = wandb.Table(
        columns=list(rows.columns), data=[[r[c] for c in rows.columns] for r in csv_rows(document, rows)]
    )
    wandb_run.log(
        {
            f"{rows.file}/table": table,
            **{f"{rows.file}/{name}": wandb.Image(str(path)) for name, path in plots.items()},
        }
    )
    for name, value in rows.summary(document).items():
        wandb_run.summary[f"{rows.file}/{name}"] = value


def report(document: dict[str, Any], eval_dir: Path, rows: RowFormat, options: dict[str, Any], wandb_run: Any) -> None:
    """Everything a results file is shown as: the CSV and plots beside it, the table on the console, the W&B log."""
    write_csv(document, eval_dir / rows.csv_file, rows)
    plots = write_plots(document, eval_dir, rows, options)
    print(format_table(document, rows), flush=True)
    drawn = ", ".join(path.name for path in plots.values())
    print(f"eval: wrote {eval_dir / rows.json_file}, {rows.csv_file}" + (f" and {drawn}" if drawn else ""), flush=True)
    if wandb_run is not None:
        log_to_wandb(wandb_run, document, rows, plots)
