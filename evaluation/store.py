"""A run's results files: one reader, one merger and one writer for every evaluator's rows.

Each evaluator's rows go to the file its RowFormat names (``eval/<file>.json``, one document per checkpoint: the
version of its format, the run's scheme, training length and step, the trained config, and a list of rows). A
document of an older format version is upgraded on read, by evaluation/migrate.py alone. A row is one measurement; the
RowFormat says what identifies it beyond the common parts of :func:`row_key`, how rows are ordered, which fields
every row must hold, and how the renderer (evaluation/render.py) shows them.

Accumulation: evaluating the same checkpoint again replaces the rows with the same key and keeps the others, so
evaluations with other settings add up; an evaluation of another checkpoint (another step) starts the file afresh.
Writes are atomic (core/files.py): a kill leaves the old file whole. A damaged file (cut short, not JSON, rows
without the fields every reader relies on) is refused with one line that names it, in every command that reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import PosGPTError
from core.files import atomic_write, read_json
from core.stored import check_literal
from evaluation.migrate import FORMAT, to_current

Row = dict[str, Any]


@dataclass(frozen=True)
class RowFormat:
    """The rows of one results file: where they go, what identifies them, and how they are shown.

    ``identity``: what tells two measurements apart besides their evaluator, length, variation and attention
    temperature; ``evaluator_of``: the evaluator of a row; ``required``: the fields every row holds; ``check``: a
    row's own check (a PosGPTError for a malformed one), on a row of the current format. The rest is the
    renderer's (evaluation/render.py): ``columns`` of the CSV and the W&B table and ``values`` computed for them;
    the console table's ``title``, ``labels`` (each row's line), ``cell`` text and ``notes`` below it; ``plots``;
    the W&B ``summary``; ``describe``, a row's provenance in words for the console's account of replaced rows;
    ``higher_is_better``: which end of a column of ``value`` is best (compare.py's mark)."""

    file: str
    value: str
    columns: tuple[str, ...]
    identity: Callable[[Row], tuple]
    sort: Callable[[Row], tuple]
    labels: Callable[[list[Row]], list[tuple[str, Row]]]
    cell: Callable[[Row], str]
    title: Callable[[dict[str, Any]], str]
    notes: Callable[[dict[str, Any], dict[str, dict[int, Row]]], str]
    plots: Callable[[dict[str, Any], Path, dict[str, Any]], dict[str, Path]]
    summary: Callable[[dict[str, Any]], dict[str, Any]]
    evaluator_of: Callable[[Row], str] = lambda row: row["evaluator"]
    values: Callable[[Row], dict[str, Any]] = lambda row: {}
    describe: Callable[[Row], str] = lambda row: ""
    required: frozenset[str] = field(default_factory=lambda: frozenset({"length"}))
    check: Callable[[Row], Row] = lambda row: row
    higher_is_better: bool = False

    @property
    def json_file(self) -> str:
        return f"{self.file}.json"

    @property
    def csv_file(self) -> str:
        return f"{self.file}.csv"


def settings_identity(row: Row) -> str:
    """A row's evaluation-time settings as one string, the settings left at null dropped: a setting a scheme gained
    later (null in every row before it) leaves the measurement what it was."""
    settings = {
        name: {key: value for key, value in setting.items() if value is not None}
        if isinstance(setting, dict)
        else setting
        for name, setting in (row.get("variation_settings") or {}).items()
    }
    return json.dumps(settings, sort_keys=True)


def row_key(row: Row, rows: RowFormat) -> tuple:
    """What identifies a measurement: a later row with the same key replaces it. A row without an attention
    temperature was evaluated without one (None)."""
    temperature = json.dumps(row.get("attn_temperature"), sort_keys=True)
    return (rows.evaluator_of(row), row["length"], settings_identity(row), temperature, *rows.identity(row))


def new_document(header: dict[str, Any], rows: list[Row]) -> dict[str, Any]:
    """A results document of the current format (evaluation/migrate.py's FORMAT): ``header`` (the scheme, training
    length, step, the evaluator's fields, the trained config) and the rows."""
    return {"format": FORMAT, **header, "results": rows}


def merge_documents(
    old: dict[str, Any] | None, new: dict[str, Any], rows: RowFormat
) -> tuple[dict[str, Any], str | None]:
    """``new`` plus the rows of ``old`` it does not replace, when both describe the same checkpoint; and one line
    saying what of ``old`` was replaced or dropped (None when nothing was)."""
    new = {**new, "results": sorted(new["results"], key=rows.sort)}
    if old is None or not old["results"]:
        return new, None
    if not all(old.get(k) == new.get(k) for k in ("pe", "train_seq_len", "step")):
        return new, (
            f"the {len(old['results'])} earlier rows scored another checkpoint (step {old.get('step')}; now "
            f"{new.get('step')}) and were dropped"
        )
    keys = {row_key(row, rows) for row in new["results"]}
    replaced = [row for row in old["results"] if row_key(row, rows) in keys]
    kept = [row for row in old["results"] if row_key(row, rows) not in keys]
    merged = {**new, "results": sorted(kept + new["results"], key=rows.sort)}
    if not replaced:
        return merged, None
    lengths = ", ".join(str(length) for length in sorted({row["length"] for row in replaced}))
    where = rows.describe(replaced[0])
    return merged, f"replaced {len(replaced)} earlier rows of the same measurement ({where}lengths {lengths})"


def load_document(eval_dir: str | Path, rows: RowFormat) -> dict[str, Any] | None:
    """The document of ``rows``' file in ``eval_dir``, or None when there is none; a damaged or malformed one is a
    PosGPTError that names the file. A document of an older format is returned upgraded to the current one
    (evaluation/migrate.py); the file is left as it is."""
    path = Path(eval_dir) / rows.json_file
    document = read_json(path)  # a damaged file (cut short, not JSON) is refused, naming it
    if document is None:
        return None
    problem = _schema_problem(document, rows.required)
    if problem:
        raise PosGPTError(f"{path} is malformed: {problem}")
    check_literal(document.get("config"), str(path))
    try:
        document = to_current(document, rows.file)
        return {**document, "results": [rows.check(row) for row in document["results"]]}
    except PosGPTError as error:
        raise PosGPTError(f"{path} is malformed: {error}") from None


def _schema_problem(document: Any, required: frozenset[str]) -> str | None:
    """What is wrong with a document's shape (the keys every reader reads), or None."""
    if not isinstance(document, dict):
        return f"expected a JSON object, found {type(document).__name__}"
    if not isinstance(document.get("pe"), str) or not isinstance(document.get("train_seq_len"), int):
        return "no 'pe' name or integer 'train_seq_len'"
    if not isinstance(document.get("results"), list):
        return "no 'results' list"
    for i, row in enumerate(document["results"]):
        if not isinstance(row, dict) or not required <= row.keys():
            return f"result {i} lacks {sorted(required - set(row) if isinstance(row, dict) else required)}"
        if not isinstance(row["length"], int):
            return f"result {i} has a non-integer length"
    return None


COMPACT = (",", ":")  # no spaces after separators: a tenth of a results file's bytes, the same JSON


def document_text(document: dict[str, Any]) -> str:
    """The document as its file holds it: compact JSON, one row per line (a file a person can scan, and still JSON)."""
    head = json.dumps({key: value for key, value in document.items() if key != "results"}, separators=COMPACT)[:-1]
    lines = ",\n".join(json.dumps(row, separators=COMPACT) for row in document["results"])
    return f'{head},"results":[\n{lines}\n]}}\n'


def write_document(document: dict[str, Any], eval_dir: str | Path, rows: RowFormat) -> Path:
    """Write the document (document_text) atomically: an interrupted write keeps the old file."""
    eval_dir = Path(eval_dir)
    eval_dir.mkdir(parents=True, exist_ok=True)
    return atomic_write(eval_dir / rows.json_file, document_text(document))
