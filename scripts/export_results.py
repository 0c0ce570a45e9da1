"""Copy what scripts/compare.py reads from training runs into a folder, without their checkpoints: results to
commit or publish beside a paper.

    python scripts/export_results.py multirun/study/*/ --to results/my-study
    python scripts/export_results.py multirun/study/*/ --to results/my-study --slim   # what results/ commits
    python scripts/compare.py results/my-study/*/ --ratios          # the same report as on the runs themselves

Per run, ``<to>/<run directory's name>/`` gets ``eval/extrapolation.json`` (and its ``.csv``), ``metrics.jsonl``
(for ``compare.py --val-curve``) and ``overrides.yaml`` (the run's command line, from ``.hydra/``).
``extrapolation.json`` records the config the scored checkpoint was trained with, which compare.py reads in
place of the checkpoint; for a file written before posgpt recorded it, the checkpoint's config is added
here, once its step is checked to be the step the file scored. A run exported again is overwritten (its
results may have grown: more variations, more data, more steps). A folder that holds another run's export (a
run of the same directory name whose trained config differs in anything a resume cannot change: its seed, its
scheme, its data, ...) is refused, naming both and a setting that differs, before anything is written: the
export would replace that run's results and leave files of both. A run's other results files and their CSVs
(``eval/tasks.json``: task accuracy, the copy probe; a plug-in evaluator's, evaluation/evaluator.py), where it has
them, are copied as they are (they always record the config); a task run has no extrapolation.json.

``--slim`` then slims each exported run as ``scripts/slim_results.py`` does (no CSVs, no per-position detail that
compare.py never draws, a training loss every 100 steps): what a study commits under results/.

It plans, then writes: every run's results are read and checked (a damaged file refused, naming it), and every
exported file's path checked (not over a run, writable, not another run's export; with ``--slim``, no training run's
directory below it, which slimming refuses) before the first is written.
"""

from __future__ import annotations

import _repo
from core.interrupts import unwind_on_sigterm

import argparse
import json
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf
from slim_results import check_task_csv, refuse_run_dirs, slim_folders

from core.checkpoint_io import load_checkpoint
from core.cli import ArgumentParser, exit_on_user_error
from core.config_keys import RESUME_SETTINGS, flatten_config
from core.errors import PosGPTError
from core.files import atomic_write, check_outputs, check_writable, inside, make_folder, read_jsonl
from core.stored import check_literal
from core.tracking import METRICS_FILE
from evaluation.evaluator import registered
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import write_csv
from evaluation.results import CSV_FILE, JSON_FILE
from evaluation.run import EVAL_DIR, load_run_results
from evaluation.store import load_document, write_document
from evaluation.task_accuracy import JSON_FILE as TASKS_JSON
from experiment.settings import changed_settings, trained_config

OVERRIDES = Path(".hydra") / "overrides.yaml"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="training run directories")
    parser.add_argument("--to", type=Path, required=True, help="the folder to export into")
    parser.add_argument(
        "--slim", action="store_true", help="slim each exported run to what compare.py reads (slim_results.py)"
    )
    return parser.parse_args(argv)


def results_with_config(run_dir: Path) -> dict | None:
    """The run's extrapolation.json, with the trained config it records (added from the checkpoint if absent);
    None for a task run, which has only tasks.json."""
    if not (run_dir / EVAL_DIR / JSON_FILE).is_file() and (run_dir / EVAL_DIR / TASKS_JSON).is_file():
        return None
    document = load_run_results(run_dir)
    if document.get("config") is None:
        checkpoint = load_checkpoint(run_dir)
        if checkpoint["step"] != document["step"]:
            raise PosGPTError(
                f"{run_dir}: its results scored step {document['step']}, its checkpoint is at step "
                f"{checkpoint['step']}: evaluate it again (python eval.py run_dir={run_dir}) before exporting"
            )
        document["config"] = checkpoint["config"]
    return document


# Copied as they are, where the run has them: (path in the run, path in the export).
# Every other evaluator's results file (task accuracy and the copy probe's tasks.json, a plug-in's) and its CSV.
OTHER_RESULTS = sorted(
    {cls.rows for cls in registered().values() if cls.rows is not PERPLEXITY_ROWS}, key=lambda rows: rows.file
)
COPIED = [
    *(
        (Path(EVAL_DIR) / name, Path(EVAL_DIR) / name)
        for rows in OTHER_RESULTS
        for name in (rows.json_file, rows.csv_file)
    ),
    (Path(METRICS_FILE), Path(METRICS_FILE)),
    (OVERRIDES, Path(OVERRIDES.name)),
]
EXPORTED = (Path(EVAL_DIR) / JSON_FILE, Path(EVAL_DIR) / CSV_FILE, *(exported for _, exported in COPIED))


def recorded_config(folder: Path) -> dict | None:
    """The trained config that the results in ``folder`` (a run, or an export of one) record: extrapolation.json's,
    else tasks.json's; None where there are neither."""
    for path in (folder / EVAL_DIR / JSON_FILE, folder / EVAL_DIR / TASKS_JSON):
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text()).get("config")
        except (OSError, ValueError, AttributeError):  # ValueError: not JSON or not UTF-8; AttributeError: not a dict
            config = None
        if not isinstance(config, dict):
            raise PosGPTError(f"{path} records no readable config: cannot tell which run {folder} holds")
        return check_literal(config, str(path))
    return None


def _as_trained(config: dict) -> dict:
    """A recorded config typed by today's schema (settings added since read as what the run was trained with), so
    that an export written by an older posgpt compares equal to its run."""
    try:
        return OmegaConf.to_container(trained_config(config), resolve=True)
    except PosGPTError:  # a config this posgpt cannot type: compared as recorded
        return config


def check_destination(run_dir: Path, document: dict | None, destination: Path) -> None:
    """Refuse to export ``run_dir`` into ``destination`` if that holds another run's export: one whose trained
    config differs in anything but what a resume may change (experiment/settings.py's RESUME_SETTINGS), so the
    same run exported again, grown, is not refused."""
    if not any((destination / exported).exists() for exported in EXPORTED):
        return  # nothing exported there yet
    there = recorded_config(destination)
    if there is None:
        raise PosGPTError(
            f"--to {destination} holds exported files but no results saying which run they are from: export "
            f"{run_dir} into another folder, or remove {destination} first (nothing was written)"
        )
    ours = document["config"] if document is not None else recorded_config(run_dir)  # a task run: tasks.json's
    ours = ours if ours is not None else load_checkpoint(run_dir)["config"]
    there, ours = _as_trained(there), _as_trained(ours)
    differences = changed_settings(there, ours, RESUME_SETTINGS)
    if differences:
        key, flat_there, flat_ours = differences[0], flatten_config(there), flatten_config(ours)
        more = f" (and {len(differences) - 1} more settings)" if len(differences) > 1 else ""
        raise PosGPTError(
            f"--to {destination} holds the export of another run than {run_dir}: {key}={flat_there.get(key)!r} "
            f"there, {key}={flat_ours.get(key)!r} in {run_dir}{more}; export it into another folder, or remove "
            f"{destination} first (nothing was written)"
        )


def check_copied(run_dir: Path) -> None:
    """Refuse, before anything is written, a run whose results copied as they are (every results file but
    extrapolation.json, metrics.jsonl) are damaged: a file cut short by a kill would be exported as if whole."""
    for rows in OTHER_RESULTS:
        load_document(run_dir / EVAL_DIR, rows)
    read_jsonl(run_dir / METRICS_FILE)


def export_run(run_dir: Path, document: dict | None, destination: Path) -> None:
    if document is not None:
        write_document(document, destination / EVAL_DIR, PERPLEXITY_ROWS)
        write_csv(document, destination / EVAL_DIR / CSV_FILE, PERPLEXITY_ROWS)
    for source, exported in COPIED:
        if (run_dir / source).is_file():
            make_folder((destination / exported).parent, destination)
            with open(run_dir / source, "rb") as original:  # whole or absent, as every write
                atomic_write(destination / exported, lambda f: shutil.copyfileobj(original, f), destination)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = [run_dir.resolve().name for run_dir in args.run_dirs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PosGPTError(f"several runs are named {', '.join(repeated)}: export them into separate folders")
    documents = [results_with_config(run_dir) for run_dir in args.run_dirs]  # all or nothing: refuse before writing
    for run_dir in args.run_dirs:
        check_copied(run_dir)
        if args.slim:  # what slimming refuses in what it copies as it is, refused before the export writes it
            check_task_csv(run_dir)
    # Never onto what is exported, nor into a training run (--to a folder of runs); each one it may write.
    outputs = {f"--to ({name}/{file})": args.to / name / file for name in names for file in EXPORTED}
    for name in names:  # a link planted in an earlier export never takes a write out of it
        for file in EXPORTED:
            inside(args.to / name, args.to / name / file)
    check_outputs(outputs, inputs=args.run_dirs)
    check_writable(outputs)
    if args.slim:  # slimming refuses a training run's directory below an export folder: refused before the export
        existing = [args.to / name for name in names if (args.to / name).is_dir()]
        refuse_run_dirs(existing, instead="move it out of --to, or export into another folder")
    for run_dir, document, name in zip(args.run_dirs, documents, names):  # a folder of another run's results
        check_destination(run_dir, document, args.to / name)
    for run_dir, document, name in zip(args.run_dirs, documents, names):
        export_run(run_dir, document, args.to / name)
        print(f"export: {run_dir} -> {args.to / name}", flush=True)
    if args.slim:
        slim_folders([args.to / name for name in names])


if __name__ == "__main__":
    unwind_on_sigterm()  # SIGTERM unwinds: an atomic write in progress leaves no temporary file
    main()
