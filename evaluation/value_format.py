"""The RowFormat of an evaluator whose rows hold one number per length and variation, for a plug-in that needs no
format of its own (evaluation/evaluator.py): ``rows = value_rows("my_metric", "score")``.

Its rows go to ``eval/<file>.json``; each row holds ``length``, the variation fields the context yields
(EvalContext.variations), the ``value`` field (a number, or None where nothing was scored, with a ``reason``), and
whatever else it records. The renderer shows a line per variation and a column per length, plots the value by length,
and logs it to W&B; scripts/compare.py tabulates it over seeds (reports/metrics.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from evaluation.results import condition_label
from evaluation.store import RowFormat

AS_TRAINED = "as trained"


def value_rows(file: str, value: str, higher_is_better: bool = False) -> RowFormat:
    """The format of rows with one ``value`` field each, in eval/<file>.json; ``higher_is_better`` says which end
    of a column compare.py marks best."""

    def label(row: dict[str, Any]) -> str:
        return condition_label(row) or AS_TRAINED

    def plots(document: dict[str, Any], eval_dir: Path, options: dict[str, Any]) -> dict[str, Path]:
        from evaluation.plots import Series, plot_value_vs_length  # matplotlib: only when drawing

        lines: dict[str, Series] = {}
        for row in sorted(document["results"], key=lambda row: row["length"]):
            line = lines.setdefault(label(row), Series(label(row), document["pe"], [], []))
            if isinstance(row.get(value), (int, float)) and math.isfinite(row[value]):
                line.x.append(row["length"])
                line.y.append(row[value])
        name = f"{value}_vs_length"
        caption = (
            f"trained at length {document['train_seq_len']} (step {document['step']}); dashed: the training length"
        )
        title = f"pe={document['pe']}: {value} by length"
        path = plot_value_vs_length(
            list(lines.values()), {document["train_seq_len"]}, eval_dir / f"{name}.png", title, caption, value
        )
        return {name: path}

    return RowFormat(
        file=file,
        value=value,
        columns=("length", "multiple", "variation", "attn_temperature", value, "scored", "scored_unit", "reason"),
        identity=lambda row: (),
        sort=lambda row: (label(row) != AS_TRAINED, label(row), row["length"]),
        labels=lambda rows: [(label(row), row) for row in sorted(rows, key=lambda row: (label(row), row["length"]))],
        cell=lambda row: "n/a" if row.get(value) is None else f"{row[value]:.4g}",
        title=lambda document: f"pe={document['pe']} {value}",
        notes=lambda document, lines: "",
        plots=plots,
        summary=lambda document: {
            f"{label(row)}/{value}@{row['length']}": row[value]
            for row in document["results"]
            if row.get(value) is not None
        },
        higher_is_better=higher_is_better,
    )
