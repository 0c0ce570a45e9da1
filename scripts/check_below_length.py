"""Does a trained task run hold its 1x accuracy below 1x? Each run is scored (through eval.py: the run's own
held-out examples and intervals) at L/2, 3L/4, L - 1 and L, L its training length, and each shorter length's
accuracy is compared with the accuracy at L. A run that fails below L learned the layout of its training
length, not the task, and its accuracy past L says nothing about extrapolation (docs/evaluation.md).

    python train.py task=passkey pe=rope train.seed=1 hydra.run.dir=runs/passkey-rope-s1
    python scripts/check_below_length.py runs/passkey-rope-s1 [--min-ratio 0.9] [--json out.json]

Exit code 0 when every run holds (accuracy >= --min-ratio x its 1x accuracy at each shorter length), 1 when one
does not; 2 for a bad argument or a run that is not a task run (refused before anything is scored).

Every run is checked before the first is scored: a task run, with a checkpoint, not being written by another
command (core.rundir.refuse_if_live: eval.py writes its eval/), and whose W&B run can start; so is --json's path;
then every run's evaluation is planned (eval.py --check), so a refusal of the last run comes before the first is
scored.
"""

from __future__ import annotations

import _repo

import argparse
import json
import subprocess
import sys
from pathlib import Path

from core.checkpoint_io import load_checkpoint
from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, check_outputs, check_writable, read_json
from core.rundir import refuse_if_live
from core.tracking import check_wandb
from data.tasks import NO_TASK
from evaluation.render import render_table
from evaluation.run import EVAL_DIR
from evaluation.task_accuracy import JSON_FILE, variation
from experiment.plan import tracker_settings
from experiment.settings import trained_config

REPO = Path(__file__).resolve().parents[1]


def ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--min-ratio must be in (0, 1] (got {text})")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="task run directories (trained and saved)")
    parser.add_argument("--min-ratio", type=ratio, default=0.9, help="the share of the 1x accuracy to hold")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    return parser.parse_args(argv)


def checked_lengths(seq_len: int) -> dict[str, int]:
    """L/2, 3L/4, L - 1 and L, rounded down."""
    return {"L/2": seq_len // 2, "3L/4": 3 * seq_len // 4, "L-1": seq_len - 1, "L": seq_len}


def trained_setting(run_dir: Path) -> dict:
    """What the run's checkpoint was trained with (an old checkpoint's length distribution read as it trained),
    once the run is checked to be one eval.py may score now: a task run, not being written by another command
    (its lock), whose W&B run (the trained logging.wandb settings, which eval.py uses) can start."""
    cfg = trained_config(load_checkpoint(run_dir)["config"])
    if cfg.task.name == NO_TASK:
        raise PosGPTError(f"{run_dir} is a language-model run: this check is for task runs (task=...)")
    refuse_if_live(run_dir)
    check_wandb(tracker_settings(cfg), run_dir)
    return {"task": cfg.task.name, "pe": cfg.pe.name, "train_lengths": cfg.task.train_lengths, "L": cfg.train.seq_len}


def run_eval(run_dir: Path, lengths: list[int], check: bool = False) -> None:
    """eval.py on the run at ``lengths`` (random depth, as trained); ``check``: its plan alone (eval.py --check),
    which scores and writes nothing. Its refusal is ours, naming the run."""
    command = [sys.executable, "eval.py", *(["--check"] if check else []), f"run_dir={run_dir}"]
    command += [f"eval.lengths=[{','.join(map(str, lengths))}]", "eval.task_depths=[]", "eval.variations=null"]
    done = subprocess.run(command, cwd=REPO, capture_output=True)
    if done.returncode != 0:
        raise PosGPTError(f"eval.py failed on {run_dir}: {done.stderr.decode().strip().splitlines()[-1]}")


def score(run_dir: Path, lengths: list[int]) -> dict[int, float]:
    """The run's accuracy (random depth, as trained) at ``lengths``, evaluated by eval.py into its eval/."""
    run_eval(run_dir, lengths)
    rows = read_json(run_dir / EVAL_DIR / JSON_FILE)["results"]  # eval.py just wrote it
    found = {row["length"]: row["accuracy"] for row in rows if row.get("depth") is None and not variation(row)}
    return {length: found[length] for length in lengths}


def verdict(setting: dict, accuracy: dict[str, float], min_ratio: float) -> dict:
    at_l = accuracy["L"]
    shorter = [value for point, value in accuracy.items() if point != "L"]
    lowest = min(shorter) / at_l if at_l else None
    holds = at_l > 0 and all(value >= min_ratio * at_l for value in shorter)
    return {**setting, "accuracy": accuracy, "lowest_ratio": lowest, "holds": holds}


@exit_on_user_error
def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.json:
        check_outputs({"--json": args.json}, args.run_dirs)
        check_writable({"--json": args.json})
    settings = {run: trained_setting(run) for run in args.run_dirs}  # every run checked before any is scored
    for run, setting in settings.items():  # and every evaluation planned (eval.py --check)
        run_eval(run, sorted(set(checked_lengths(setting["L"]).values())), check=True)
    results = []
    for run, setting in settings.items():
        points = checked_lengths(setting["L"])
        scored = score(run, sorted(set(points.values())))
        accuracy = {point: scored[length] for point, length in points.items()}
        results.append({"run": str(run), **verdict(setting, accuracy, args.min_ratio)})
    header = ["run", "task", "pe", "train_lengths", *checked_lengths(1), "lowest ratio", "holds"]
    body = [
        [Path(r["run"]).name, r["task"], r["pe"], r["train_lengths"]]
        + [f"{a:.3f}" for a in r["accuracy"].values()]
        + ["n/a" if r["lowest_ratio"] is None else f"{r['lowest_ratio']:.3f}", "yes" if r["holds"] else "NO"]
        for r in results
    ]
    print(render_table(header, body))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.json, json.dumps(results, indent=1) + "\n")
    return 0 if all(r["holds"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
