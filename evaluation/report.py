"""Extrapolation results as files: ``extrapolation.json`` (accumulated), ``extrapolation.csv``, text tables.

The JSON document describes one checkpoint:

    {"pe": "rope", "train_seq_len": 64, "step": 1500, "data": "python_stdlib", "config": {"model": {...}, ...},
     "results": [{"length": 512, "protocol": "sliding", "stride": 256, "scaling": {"type": "yarn", ...},
                  "data": "python_stdlib", "tokens": 32768, "loss": 3.1, "ppl": 22.2,
                  "target_range": [512, 33280], "per_position_loss": [...], "peak_memory_mb": 812.5,
                  "memory_metric": "cpu_peak_rss", "seconds": 4.2}, ...]}

The top-level "data" is the latest evaluation's; each row names its own. "config" is the checkpoint's: the
resolved configuration the model was trained with (model, scheme, data, seed, ...), so that the file says
what produced its numbers without the checkpoint (absent in files written before 2026-11-23). A row that
could not be scored (learned beyond its table, too little data) has ``"loss"`` and ``"ppl"`` null and a
``"reason"``.
Accumulation: each evaluation of the same checkpoint replaces the rows with the
same (data, length, protocol, stride, scaling) and keeps the others, so ``eval.py`` runs with different
scalings, strides or data add up; an evaluation of another checkpoint (another training step) starts the
file afresh, since the old rows describe another model.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import PosGPTError
from evaluation.extrapolation import effective_stride
from evaluation.stats import Estimate
from model.pe.rope_scaling import scaling_label

JSON_FILE = "extrapolation.json"
CSV_FILE = "extrapolation.csv"
CSV_COLUMNS = [
    "data",
    "length",
    "multiple",
    "protocol",
    "stride",
    "scaling",
    "tokens",
    "loss",
    "ppl",
    "peak_memory_mb",
    "memory_metric",
    "seconds",
    "reason",
]
ROW_REQUIRED = {"length", "protocol", "stride", "ppl"}  # what every reader of a row relies on


def results_document(pe_name: str, train_seq_len: int, rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"pe": pe_name, "train_seq_len": train_seq_len, **extra, "results": rows}


def row_key(row: dict[str, Any]) -> tuple:
    """What identifies a measurement: a later one with the same key replaces it."""
    scaling = row.get("scaling")
    if scaling is not None:  # a setting left at null is the same measurement as one from before it existed
        scaling = {name: value for name, value in scaling.items() if value is not None}
    return (row.get("data"), row["length"], row["protocol"], row["stride"], json.dumps(scaling, sort_keys=True))


def _sort_key(row: dict[str, Any]) -> tuple:
    scaling = scaling_label(row.get("scaling"))
    return (
        str(row.get("data")),
        scaling not in ("", "none"),
        scaling,
        row["protocol"],
        row["length"],
        row["stride"] or 0,
    )


def merge_documents(
    old: dict[str, Any] | None, new: dict[str, Any], key: Callable = row_key, sort: Callable = _sort_key
) -> dict[str, Any]:
    """``new`` plus the rows of ``old`` it does not replace, when both describe the same checkpoint (``key``
    identifies a measurement; evaluation/tasks.py passes its own)."""
    same_checkpoint = old is not None and all(old.get(k) == new.get(k) for k in ("pe", "train_seq_len", "step"))
    if not same_checkpoint:
        return new
    replaced = {key(row) for row in new["results"]}
    rows = [row for row in old["results"] if key(row) not in replaced] + new["results"]
    return {**new, "results": sorted(rows, key=sort)}


def load_results(eval_dir: str | Path) -> dict[str, Any] | None:
    """The document in ``eval_dir``, or None when there is none; a corrupt or malformed one is a PosGPTError
    that names the file."""
    path = Path(eval_dir) / JSON_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:  # ValueError: not JSON, or not UTF-8
        raise PosGPTError(f"{path} is unreadable or not JSON ({type(error).__name__}: {error})") from None
    problem = _schema_problem(document)
    if problem:
        raise PosGPTError(f"{path} is malformed: {problem}")
    return document


def _schema_problem(document: Any) -> str | None:
    """What is wrong with a document's shape (the keys the tables and plots read), or None."""
    if not isinstance(document, dict):
        return f"expected a JSON object, found {type(document).__name__}"
    if not isinstance(document.get("pe"), str) or not isinstance(document.get("train_seq_len"), int):
        return "no 'pe' name or integer 'train_seq_len'"
    if not isinstance(document.get("results"), list):
        return "no 'results' list"
    for i, row in enumerate(document["results"]):
        if not isinstance(row, dict) or not ROW_REQUIRED <= row.keys():
            return f"result {i} lacks {sorted(ROW_REQUIRED - set(row) if isinstance(row, dict) else ROW_REQUIRED)}"
        if not isinstance(row["length"], int) or not (row["ppl"] is None or isinstance(row["ppl"], (int, float))):
            return f"result {i} has a non-integer length or a non-numeric ppl"
    return None


def read_results(eval_dir: str | Path) -> dict[str, Any] | None:
    """Like load_results, for eval's accumulation: an unreadable document is reported and then rewritten."""
    try:
        return load_results(eval_dir)
    except PosGPTError as error:
        print(f"eval: ignoring the previous results ({error}); they will be rewritten", flush=True)
        return None


def write_results(document: dict[str, Any], eval_dir: str | Path, name: str = JSON_FILE) -> Path:
    """Write ``extrapolation.json`` (or ``name``) atomically: an interrupted write keeps the old file."""
    eval_dir = Path(eval_dir)
    eval_dir.mkdir(parents=True, exist_ok=True)
    path = eval_dir / name
    # One result per line (per-position losses make rows long): a file a person can scan, and still JSON.
    head = json.dumps({key: value for key, value in document.items() if key != "results"})[:-1]
    rows = ",\n".join(" " + json.dumps(row) for row in document["results"])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f'{head}, "results": [\n{rows}\n]}}\n')
    tmp.replace(path)
    return path


def csv_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows as flat records with CSV_COLUMNS (no per-position losses; scaling as a label)."""
    return [
        {
            **{column: row.get(column) for column in CSV_COLUMNS},
            "multiple": round(row["length"] / document["train_seq_len"], 4),
            "scaling": scaling_label(row.get("scaling")),
        }
        for row in document["results"]
    ]


def write_csv(document: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(document))
    return path


def setting_label(row: dict[str, Any], with_data: bool = False) -> str:
    """``sliding yarn:8``: what distinguishes a row at a given length. A sliding stride is shown when it is
    not the default L/2, so default-stride rows of all lengths share a label."""
    label = row["protocol"]
    if row["stride"] and row["stride"] != effective_stride(row["length"], None):
        label += f" (S={row['stride']})"
    if scaling_label(row.get("scaling")) not in ("", "none"):
        label += " " + scaling_label(row["scaling"])
    return f"[{row.get('data')}] {label}" if with_data else label


def format_number(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def format_ppl(ppl: float | None) -> str:
    return "n/a" if ppl is None else format_number(ppl)


def format_estimate(estimate: Estimate | None, n_expected: int = 1, digits: int = 2) -> str:
    """A results cell: "n/a" for None, the value alone for one seed, else "mean ± half-width of the 95% CI";
    "(n=k)" when fewer values than the row's n_expected seeds went into it."""
    if estimate is None:
        return "n/a"
    value = format_number(estimate.mean, digits)
    if estimate.half_width is not None:
        value += f" ± {format_number(estimate.half_width, digits)}"
    return value + (f" (n={estimate.n})" if estimate.n != n_expected else "")


def length_header(lengths: list[int], train_len: int | None) -> list[str]:
    """Column titles: each length and, when the runs share one training length, its multiple of it."""
    return [f"{L}" + (f" ({L / train_len:g}×)" if train_len else "") for L in lengths]


def render_table(header: list[str], body: list[list[str]], markdown: bool = False) -> str:
    """The one results-table layout: the first column left-aligned labels, the others right-aligned values,
    as aligned plain text (eval.py's console table) or as a markdown table (scripts/compare.py)."""
    if markdown:
        return "\n".join(
            ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
            + ["| " + " | ".join(line) + " |" for line in body]
        )
    lines = [header] + body
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
        for line in lines
    )


def format_table(document: dict[str, Any]) -> str:
    """Rows: settings (protocol, stride, scaling); columns: lengths and their multiple of the training length."""
    rows = sorted(document["results"], key=_sort_key)
    train_len = document["train_seq_len"]
    with_data = len({row.get("data") for row in rows}) > 1
    lengths = sorted({row["length"] for row in rows})
    by_setting: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_setting.setdefault(setting_label(row, with_data), {})[row["length"]] = row
    header = [f"pe={document['pe']} ppl"] + length_header(lengths, train_len)
    body = [
        [label] + [format_ppl(cells[L]["ppl"]) if L in cells else "-" for L in lengths]
        for label, cells in by_setting.items()
    ]
    text = render_table(header, body)
    spans = sorted({(str(row.get("data")), *row["target_range"]) for row in rows if row["ppl"] is not None})
    if len(spans) == len({data for data, _, _ in spans}):  # one token range per corpus
        return (
            text
            + "\n(each cell scores the same targets: "
            + "; ".join((f"{data} " if with_data else "") + f"[{start}, {stop})" for data, start, stop in spans)
            + ")"
        )
    return text + (
        "\n(cells come from evaluations of different token ranges: compare rows with the same "
        "target_range in extrapolation.json)"
    )
