"""Extrapolation results as files: ``extrapolation.json`` (accumulated), ``extrapolation.csv``, text tables.

The JSON document describes one checkpoint:

    {"pe": "rope", "train_seq_len": 64, "step": 1500, "data": "python_stdlib",
     "results": [{"length": 512, "protocol": "sliding", "stride": 256, "scaling": {"type": "yarn", ...},
                  "data": "python_stdlib", "tokens": 32768, "loss": 3.1, "ppl": 22.2,
                  "target_range": [512, 33280], "per_position_loss": [...], "peak_memory_mb": 812.5,
                  "memory_metric": "cpu_peak_rss", "seconds": 4.2}, ...]}

The top-level "data" is the latest evaluation's; each row names its own. A row that could not be scored
(learned beyond its table, too little data) has ``"loss"`` and ``"ppl"`` null and a ``"reason"``.
Accumulation: each evaluation of the same checkpoint replaces the rows with the
same (data, length, protocol, stride, scaling) and keeps the others, so ``eval.py`` runs with different
scalings, strides or data add up; an evaluation of another checkpoint (another training step) starts the
file afresh, since the old rows describe another model.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from evaluation.extrapolation import effective_stride
from model.pe.rope_scaling import scaling_label

JSON_FILE = "extrapolation.json"
CSV_FILE = "extrapolation.csv"
CSV_COLUMNS = ["data", "length", "multiple", "protocol", "stride", "scaling", "tokens", "loss", "ppl",
               "peak_memory_mb", "memory_metric", "seconds", "reason"]


def results_document(pe_name: str, train_seq_len: int, rows: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"pe": pe_name, "train_seq_len": train_seq_len, **extra, "results": rows}


def row_key(row: dict[str, Any]) -> tuple:
    """What identifies a measurement: a later one with the same key replaces it."""
    return (row.get("data"), row["length"], row["protocol"], row["stride"],
            json.dumps(row.get("scaling"), sort_keys=True))


def _sort_key(row: dict[str, Any]) -> tuple:
    scaling = scaling_label(row.get("scaling"))
    return (str(row.get("data")), scaling not in ("", "none"), scaling, row["protocol"], row["length"],
            row["stride"] or 0)


def merge_documents(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` plus the rows of ``old`` it does not replace, when both describe the same checkpoint."""
    same_checkpoint = old is not None and all(old.get(k) == new.get(k) for k in ("pe", "train_seq_len", "step"))
    if not same_checkpoint:
        return new
    replaced = {row_key(row) for row in new["results"]}
    rows = [row for row in old["results"] if row_key(row) not in replaced] + new["results"]
    return {**new, "results": sorted(rows, key=_sort_key)}


def read_results(eval_dir: str | Path) -> dict[str, Any] | None:
    """The document in ``eval_dir``, or None when there is none (or it is unreadable: it is then rewritten)."""
    path = Path(eval_dir) / JSON_FILE
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        print(f"eval: ignoring unreadable {path} ({error}); it will be rewritten", flush=True)
        return None
    return document if isinstance(document, dict) and isinstance(document.get("results"), list) else None


def write_results(document: dict[str, Any], eval_dir: str | Path) -> Path:
    """Write ``extrapolation.json`` (atomically: an interrupted write keeps the old file)."""
    eval_dir = Path(eval_dir)
    eval_dir.mkdir(parents=True, exist_ok=True)
    path = eval_dir / JSON_FILE
    # One result per line (per-position losses make rows long): a file a person can scan, and still JSON.
    head = json.dumps({key: value for key, value in document.items() if key != "results"})[:-1]
    rows = ",\n".join(" " + json.dumps(row) for row in document["results"])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f'{head}, "results": [\n{rows}\n]}}\n')
    tmp.replace(path)
    return path


def csv_rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows as flat records with CSV_COLUMNS (no per-position losses; scaling as a label)."""
    return [{
        **{column: row.get(column) for column in CSV_COLUMNS},
        "multiple": round(row["length"] / document["train_seq_len"], 4),
        "scaling": scaling_label(row.get("scaling")),
    } for row in document["results"]]


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


def format_ppl(ppl: float | None) -> str:
    if ppl is None:
        return "n/a"
    return f"{ppl:.2f}" if ppl < 1e4 else f"{ppl:,.0f}"


def format_table(document: dict[str, Any]) -> str:
    """Rows: settings (protocol, stride, scaling); columns: lengths and their multiple of the training length."""
    rows = sorted(document["results"], key=_sort_key)
    train_len = document["train_seq_len"]
    with_data = len({row.get("data") for row in rows}) > 1
    lengths = sorted({row["length"] for row in rows})
    by_setting: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        by_setting.setdefault(setting_label(row, with_data), {})[row["length"]] = row
    header = [f"pe={document['pe']} ppl"] + [f"{L} ({L / train_len:g}x)" for L in lengths]
    lines = [header] + [
        [label] + [format_ppl(cells[L]["ppl"]) if L in cells else "-" for L in lengths]
        for label, cells in by_setting.items()
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines)
    spans = sorted({(str(row.get("data")), *row["target_range"]) for row in rows if row["ppl"] is not None})
    if len(spans) == len({data for data, _, _ in spans}):  # one token range per corpus
        return text + "\n(each cell scores the same targets: " + "; ".join(
            (f"{data} " if with_data else "") + f"[{start}, {stop})" for data, start, stop in spans) + ")"
    return text + ("\n(cells come from evaluations of different token ranges: compare rows with the same "
                   "target_range in extrapolation.json)")
