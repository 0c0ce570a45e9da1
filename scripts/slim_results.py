"""Slim exported results (scripts/export_results.py) to what scripts/compare.py reads, in place: the files a study
commits under results/.

    python scripts/slim_results.py results/my-study/         # after export_results.py; a second run changes nothing
    python scripts/slim_results.py --csv results/my-study/   # write the per-run CSVs back from the JSON

Under each folder given, per run:

- ``eval/extrapolation.json`` loses each row's ``per_position_loss`` (one loss per position, thousands of numbers
  a row, that nothing in compare.py reads), and its ``per_position_bins`` except where ``compare.py
  --per-position`` can draw them: that draws the longest length any run scored (of the protocol, data and measure
  compared), so each run's rows at its own longest scored length of each keep theirs (every row of the sliding
  protocol keeps them: there the stride compared changes with the length).
- every results JSON (each evaluator's: ``extrapolation.json``, ``tasks.json``, ...) is written in the layout
  evaluation/store.py writes (``document_text``: compact, one row a line), as eval.py and export_results.py write it.
- ``eval/extrapolation.csv`` and ``eval/tasks.csv`` are removed: each is the JSON beside it, row for row
  (evaluation/results.py and evaluation/task_accuracy.py write them from it), and ``--csv`` writes them again. A CSV is
  removed only once every value in it is checked to be the JSON's; one that is not is refused, and nothing is
  written.
- ``metrics.jsonl`` (and a study's ``*metrics.jsonl`` copied beside its runs) keeps every step that logged a
  validation loss (``compare.py --val-curve``) and, of the steps that logged only a training loss, the first, the
  last and every TRAIN_LOSS_EVERY-th; each with its step, training and validation loss. Every other record (each
  start's attention backend and dtype, a fine-tuning's parent) stays whole. The learning rate (the config's
  schedule), the gradient norm and the step timings (tokens/s, MFU) are dropped.

``python scripts/export_results.py ... --slim`` exports slimmed in one step.

Only exported results are slimmed: a training run's directory (core.rundir.RUN_MARKERS: its checkpoints/,
``.hydra/``, train.log or lock file) given, or found below a folder given, is refused, naming it, in both modes;
slimming it in place would cut the run's own log and results. Export it instead, slimmed:
``python scripts/export_results.py RUN --to DIR --slim``.

It plans, then writes: every folder is searched for training runs' directories, then every file of every folder is
read and checked and every folder it rewrites checked writable, before the first file is changed; a refusal changes
nothing.
"""

from __future__ import annotations

import _repo
from core.interrupts import unwind_on_sigterm

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, check_folder, check_writable, inside, read_json, read_jsonl, remove
from core.rundir import RUN_MARKERS
from evaluation.evaluator import registered
from evaluation.render import csv_rows, write_csv
from evaluation.results import JSON_FILE, row_ppl
from evaluation.run import EVAL_DIR
from evaluation.store import RowFormat, document_text
from evaluation.task_accuracy import TASK_ROWS

DROPPED_ROW_KEYS = ("per_position_loss",)
BINS = "per_position_bins"
KEPT_STEP_KEYS = ("step", "train_loss", "val_loss")  # a logged step's record: what --val-curve and the READMEs read
# A training loss every 100 steps draws the curve (runs log every 10): compare.py reads only the validation loss
TRAIN_LOSS_EVERY = 100
METRICS_GLOB = "*metrics.jsonl"
Change = str | None  # a file's new text, or None: remove the file
# (the JSON, the CSV written from it, its rows as that CSV writes them, the writer)
# Every evaluator's results file, each with the CSV written from it (and rebuilt from it by --csv).
FORMATS = tuple(sorted({cls.rows for cls in registered().values()}, key=lambda rows: rows.file))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="folders of exported runs (a study under results/)")
    parser.add_argument("--csv", action="store_true", help="only write each run's CSVs back from its JSON")
    return parser.parse_args(argv)


def _selection(row: dict[str, Any]) -> tuple:
    """What compare.py selects a row by, besides its length (reports/perplexity.py, _wanted)."""
    return row["protocol"], str(row.get("data")), row.get("measure")


def bins_drawn(rows: list[dict[str, Any]]) -> list[bool]:
    """Per row, whether ``compare.py --per-position`` can draw its bins: a row of the sliding protocol, or a
    scored row at the longest length of its selection (protocol, data, measure) scored in this run; any
    comparison's longest length is some run's longest, and a run scored shorter is not drawn there."""
    longest: dict[tuple, int] = {}
    for row in rows:
        if row_ppl(row) is not None:
            longest[_selection(row)] = max(longest.get(_selection(row), 0), row["length"])
    return [
        row["protocol"] == "sliding" or (row_ppl(row) is not None and longest[_selection(row)] == row["length"])
        for row in rows
    ]


def slim_document(document: dict[str, Any]) -> dict[str, Any]:
    """``extrapolation.json``'s document without the rows' per-position losses, and without the position bins
    that compare.py never draws (bins_drawn)."""
    rows = []
    for row, drawn in zip(document["results"], bins_drawn(document["results"])):
        dropped = DROPPED_ROW_KEYS if drawn else (*DROPPED_ROW_KEYS, BINS)
        rows.append({key: value for key, value in row.items() if key not in dropped})
    return {**document, "results": rows}


def slim_metrics(text: str) -> str:
    """``metrics.jsonl`` with each logged step's record cut to KEPT_STEP_KEYS, and of the steps without a
    validation loss only the first, the last and every TRAIN_LOSS_EVERY-th kept; other records (a start's
    backend and dtype, a fine-tuning's parent) and blank lines as they are."""
    records = [json.loads(line) if line.strip() else None for line in text.splitlines()]
    steps = [i for i, record in enumerate(records) if isinstance(record, dict) and "train_loss" in record]
    ends = {steps[0], steps[-1]} if steps else set()
    lines = []
    for i, (line, record) in enumerate(zip(text.splitlines(), records)):
        if i in steps:
            if record.get("val_loss") is None and record["step"] % TRAIN_LOSS_EVERY != 0 and i not in ends:
                continue
            line = json.dumps({key: record[key] for key in KEPT_STEP_KEYS if key in record})
        lines.append(line)
    return "".join(line + "\n" for line in lines)


def _cell(value: Any) -> str:
    """A value as csv.DictWriter writes it."""
    return "" if value is None else str(value)


def csv_problem(csv_path: Path, rows: list[dict[str, Any]], document: dict[str, Any]) -> str | None:
    """Why ``csv_path`` is not the JSON's rows (``rows``, as today's writer writes them), or None when it holds
    nothing more. A column today's writer no longer writes (a CSV of an older posgpt: ``scaling``, the label of
    the row's ``scaling`` settings) must be a setting the JSON's row records."""
    with open(csv_path, newline="") as f:
        written = list(csv.DictReader(f))
    if len(written) != len(rows):
        return f"{len(written)} rows, the JSON has {len(rows)}"
    for number, (old, new, source) in enumerate(zip(written, rows, document["results"]), start=2):
        for column, value in old.items():
            if column not in new:
                if column not in source:
                    return f"line {number}: column {column!r} is not in the JSON"
            elif value != _cell(new[column]):
                return f"line {number}: {column} is {value!r}, the JSON's is {_cell(new[column])!r}"
    return None


def checked_csv(json_path: Path, rows: RowFormat, document: dict[str, Any]) -> Path | None:
    """The CSV of ``rows`` beside ``json_path``, where there is one, once it is checked to hold nothing the JSON
    (``document``) does not; one that does is refused, naming it."""
    csv_path = json_path.with_name(rows.csv_file)
    if not csv_path.is_file():
        return None
    problem = csv_problem(csv_path, csv_rows(document, rows), document)
    if problem is not None:
        raise PosGPTError(f"{csv_path} is not {json_path.name} beside it ({problem}): nothing was written")
    return csv_path


def check_task_csv(run_dir: Path) -> None:
    """Refuse a run's ``eval/tasks.csv`` that slimming would refuse once copied: export_results.py --slim copies it
    as it is, so it checks it before it writes anything."""
    document = read_json(run_dir / EVAL_DIR / TASK_ROWS.json_file)
    if isinstance(document, dict) and isinstance(document.get("results"), list):
        checked_csv(run_dir / EVAL_DIR / TASK_ROWS.json_file, TASK_ROWS, document)


def plan_folder(folder: Path) -> dict[Path, Change]:
    """What slimming ``folder`` writes: {path: its new text or document, or None to remove it}; refuses, naming the
    file, a CSV that holds something its JSON does not."""
    plan: dict[Path, Change] = {}
    for rows in FORMATS:
        json_name = rows.json_file
        for json_path in sorted(folder.rglob(f"{EVAL_DIR}/{json_name}")):
            document = read_json(json_path)  # a damaged file (cut short, not JSON) is refused, naming it
            if not isinstance(document, dict) or not isinstance(document.get("results"), list):
                raise PosGPTError(f"{json_path} is malformed: no 'results' list; nothing was written")
            csv_path = checked_csv(json_path, rows, document)
            if csv_path is not None:
                plan[csv_path] = None
            text = document_text(slim_document(document) if json_name == JSON_FILE else document)
            if text != json_path.read_text():
                plan[json_path] = text
    for metrics_path in sorted(folder.rglob(METRICS_GLOB)):
        read_jsonl(metrics_path)  # a torn or damaged line is refused, naming the file, before anything is written
        text = metrics_path.read_text()
        slim = slim_metrics(text)
        if slim != text:
            plan[metrics_path] = slim
    return plan


def apply_plan(plan: dict[Path, Change]) -> None:
    for path, change in plan.items():
        if change is None:
            remove(path)
        else:
            atomic_write(path, change)


def plan_csvs(folder: Path) -> list[tuple[RowFormat, dict[str, Any], Path]]:
    """The CSVs ``--csv`` writes under ``folder``: (the rows' format, the JSON's document, the CSV's path), each JSON
    read and checked (a damaged or malformed one refused, naming it) and each CSV's path checked writable."""
    planned = []
    for rows in FORMATS:
        for json_path in sorted(folder.rglob(f"{EVAL_DIR}/{rows.json_file}")):
            document = read_json(json_path)
            if not isinstance(document, dict) or not isinstance(document.get("results"), list):
                raise PosGPTError(f"{json_path} is malformed: no 'results' list; nothing was written")
            planned.append((rows, document, json_path.with_name(rows.csv_file)))
            check_writable({"--csv": json_path.with_name(rows.csv_file)})
    return planned


def run_marker(path: Path) -> str | None:
    """The first of a training run's markers (core.rundir.RUN_MARKERS) that the directory ``path`` holds, or None:
    core.rundir.is_run_dir, also counting a marker that is a dangling link."""
    return next((marker for marker in RUN_MARKERS if os.path.lexists(path / marker)), None)


def run_dirs_in(folders: list[Path]) -> list[tuple[Path, str]]:
    """The training runs' directories among ``folders`` and below them, each with a marker it holds (exports have
    none); links are not followed (refuse_links_out refuses one that leads out)."""
    found: dict[Path, str] = {}
    for folder in folders:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir() and (path == folder or not path.is_symlink()):
                marker = run_marker(path)
                if marker is not None:
                    found.setdefault(path, marker)
    return sorted(found.items())


def refuse_run_dirs(folders: list[Path], instead: str | None = None) -> None:
    """Refuse (PosGPTError, before anything is written) a training run's directory among ``folders`` or below them,
    naming it and what to do instead (``instead``; by default, export it slimmed): slimming rewrites files in place,
    and would cut the run's own metrics.jsonl and results."""
    found = run_dirs_in(folders)
    if not found:
        return
    (run_dir, marker), more = found[0], len(found) - 1
    others = f" (and {more} more run {'directory' if more == 1 else 'directories'})" if more else ""
    instead = instead or f"export it instead, slimmed: python scripts/export_results.py {run_dir} --to DIR --slim"
    raise PosGPTError(
        f"{run_dir} is a training run's directory (it holds {marker}){others}: slim_results.py slims exported "
        f"results in place and would cut the run's own log and results; {instead} (nothing was written)"
    )


def slim_folders(folders: list[Path]) -> None:
    """Slim each folder in place, printing what it saved; every folder is checked before any is written, a training
    run's directory among them or below them refused (refuse_run_dirs)."""
    refuse_run_dirs(folders)
    _slim(folders)


def refuse_links_out(folders: list[Path]) -> None:
    """Refuse a link under a folder that leads out of it: its files would be skipped, left unslimmed, or written
    through (core.files.inside)."""
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_symlink():
                inside(folder, path)


def _slim(folders: list[Path]) -> None:
    refuse_links_out(folders)
    plans = {folder: plan_folder(folder) for folder in folders}
    for folder, plan in plans.items():  # a rewrite (renamed into place), a removal: never through a link out
        for path in plan:
            inside(folder, path)
            check_folder(f"slimming {path}: its folder", path.parent)
    for folder, plan in plans.items():
        before = sum(path.stat().st_size for path in plan)
        apply_plan(plan)
        after = sum(path.stat().st_size for path in plan if path.exists())
        removed = sum(text is None for text in plan.values())
        print(
            f"slim_results: {folder}: {len(plan) - removed} files slimmed, {removed} removed, "
            f"{before:,} -> {after:,} bytes",
            flush=True,
        )


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    missing = [str(folder) for folder in args.folders if not folder.is_dir()]
    if missing:
        raise PosGPTError(f"no such folder: {', '.join(missing)}")
    if args.csv:
        refuse_run_dirs(args.folders)
        refuse_links_out(args.folders)
        plans = {folder: plan_csvs(folder) for folder in args.folders}  # every folder checked before any write
        for folder, planned in plans.items():
            for rows, document, path in planned:
                write_csv(document, path, rows)
            print(f"slim_results: wrote {len(planned)} CSVs under {folder}", flush=True)
        return
    slim_folders(args.folders)


if __name__ == "__main__":
    unwind_on_sigterm()  # SIGTERM unwinds: an atomic write in progress leaves no temporary file
    main()
