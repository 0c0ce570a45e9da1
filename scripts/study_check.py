"""The plan of a study (scripts/study.sh), made whole before the first run trains: its options, its folder, and every
run of every scheme and task, in one process.

    python scripts/study_check.py --plan-to FILE [--seeds N | --seed-list A,B] [--schemes a,b] [--tasks a,b]
        [--list] [DIR] [OVERRIDES...]

It takes study.sh's own command line (study.sh's options are declared here, each with its domain) and the file that
study.sh reads the plan from. Each scheme's seeds are planned as the sweep ``train.py --check -m pe=SCHEME
train.seed=SEEDS ARGS...`` plans them. A scheme whose first seed train.py refuses with these settings is skipped,
with one line on stderr. A refusal of a later seed (a value that only that seed makes invalid), of every scheme, or
of the command itself stops the study in one line, exit 2, before its folder is made. With --list it prints the
runs it would make, and makes none.

The plan holds NUL-separated fields: the study's folder; ``tasks`` or ``text``; ``list`` or ``train``; then for
each run, its folder, its task, its scheme, the eval.variations it is evaluated with ("" for none), the count of its
train.py arguments, and those arguments.
"""

from __future__ import annotations

import _repo  # noqa: F401  (the repository's packages on sys.path)
from core.interrupts import unwind_on_sigterm

import argparse
import dataclasses
import datetime
import errno
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from study_variations import STUDY_VARIATIONS

from core.cli import ArgumentParser, count, exit_on_user_error
from core.errors import MachineFault, PosGPTError
from core.files import atomic_write, check_folder, check_outputs, check_writable
from experiment import CONFIG_DIR

# The planner's modules (torch, Hydra: seconds to import) are imported once the options are read, so that a mistake
# in them is answered at once.

LATER_SEED = re.compile(r"job [1-9][0-9]* of the sweep")  # experiment/plan.py's plan_each names a refused job so
# A Hydra override (key=value, the value holding any character, a slash too): the first argument is the study's
# folder unless it reads as one; an existing folder is a folder whatever its name holds.
OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][A-Za-z0-9_.@]*(/[A-Za-z0-9_.@]+)*=")
# The language-model study's own settings: 1x .. 16x, and 8 sequences a step, as the committed studies were trained.
TEXT_STUDY = ("eval.length_multipliers=[1,2,4,8,16]", "train.batch_size=8")
NO_TASK = "none"  # the language-model study's task (train.py's default)
# mkdir's errors that are a mistake in the command (exit 2); any other is the machine's (74)
COMMAND_ERRORS = (errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP)


def config_names(group: str, what: str, option: str, leave_out: str = "") -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names of configs/<group>/*.yaml but ``leave_out``."""

    def parse(text: str) -> list[str]:
        known = sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml") if path.stem != leave_out)
        unknown = next((name for name in text.split(",") if name not in known), None)
        if unknown is not None:
            raise argparse.ArgumentTypeError(
                f"{option} takes {what} of configs/{group}/ ({','.join(known)}), got '{unknown}'"
            )
        return text.split(",")

    parse.__name__ = f"{what} names"  # argparse names the type so in its messages
    return parse


def seed_list(text: str) -> list[int]:
    """An argparse type: comma-separated seeds (train.seed's own domain is train.py's to check)."""
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", text):
        raise argparse.ArgumentTypeError(f"--seed-list takes comma-separated seeds (4,5), got '{text}'")
    return [int(seed) for seed in text.split(",")]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="scripts/study.sh", description="Plan a study: every run, before the first trains.")
    parser.add_argument("--plan-to", type=Path, required=True, help="the file study.sh reads the plan from")
    parser.add_argument("--seeds", type=count(1), default=None, help="seeds 1..N (default 3)")
    parser.add_argument("--seed-list", type=seed_list, default=None, help="these seeds (4,5): a part of a study")
    parser.add_argument("--schemes", type=config_names("pe", "schemes", "--schemes"), help="default: every scheme")
    parser.add_argument(
        "--tasks", type=config_names("task", "tasks", "--tasks", NO_TASK), help="the task study on these"
    )
    parser.add_argument("--list", action="store_true", help="print the runs it would make, make none")
    parser.add_argument("arguments", nargs="*", help="the study's folder, then Hydra overrides for train.py")
    args = parser.parse_intermixed_args(argv)
    if args.seeds is not None and args.seed_list is not None:  # one of them would be read, the other ignored
        raise PosGPTError("--seeds is not read when --seed-list gives the seeds: drop one of them")
    return args


@dataclasses.dataclass(frozen=True)
class Study:
    """What a study's command line asks for: its folder, seeds, schemes, tasks (``none``: the language-model
    study) and the overrides every run is trained with."""

    folder: str
    seeds: list[int]
    schemes: list[str]
    tasks: list[str]
    overrides: list[str]

    def run_dir(self, task: str, scheme: str, seed: int) -> str:
        """<dir>/<scheme>-s<seed>, and <dir>/<task>-<scheme>-s<seed> in the task study."""
        return f"{self.folder}/{scheme}-s{seed}" if task == NO_TASK else f"{self.folder}/{task}-{scheme}-s{seed}"

    def train_args(self, task: str) -> list[str]:
        """What every run of ``task`` is trained with besides its scheme and seed: the study's settings, its W&B
        group (named after its folder, where W&B runs), then the overrides."""
        own = list(TEXT_STUDY) if task == NO_TASK else [f"task={task}"]
        group = os.path.basename(self.folder.rstrip("/")).replace("'", "\\'")  # quoted: a comma stays one value
        named = [] if "logging.wandb.mode=disabled" in self.overrides else [f"logging.wandb.group='{group}'"]
        return [*own, *named, *self.overrides]


def study_of(args: argparse.Namespace) -> Study:
    rest = list(args.arguments)
    folder = f"multirun/study-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    if rest and (os.path.isdir(rest[0]) or not OVERRIDE.match(rest[0])):
        folder = rest.pop(0)
    seeds = args.seed_list or list(range(1, (args.seeds or 3) + 1))
    schemes = args.schemes or sorted(path.stem for path in (CONFIG_DIR / "pe").glob("*.yaml"))
    return Study(folder, seeds, schemes, args.tasks or [NO_TASK], rest)


def verdict(scheme: str, seeds: list[int], args: list[str]) -> str | None:
    """None where train.py --check accepts every seed of ``scheme``; the refusal of its first seed (the scheme is
    refused with these settings); raises the refusal of a later seed."""
    from experiment.compose import check_group_choices
    from train import check_only

    argv = [*args, f"pe={scheme}", f"train.seed={','.join(map(str, seeds))}", "-m"]
    try:
        check_group_choices(argv)
        check_only(argv)
    except PosGPTError as error:
        if LATER_SEED.match(str(error)):
            raise
        return str(error)
    return None


def check_variations(scheme: str, variations: str, args: list[str]) -> None:
    """The evaluation each run of ``scheme`` gets after training (eval.py with ``variations``), checked as eval.py
    checks it, before any run trains: a variation it would refuse is the study's mistake ($EVAL_VARIATIONS)."""
    from experiment.plan import check_later_evaluation

    try:
        check_later_evaluation([*args, f"pe={scheme}"], [f"eval.variations={variations}"])
    except PosGPTError as error:
        source = "$EVAL_VARIATIONS" if os.environ.get("EVAL_VARIATIONS") else "scripts/study_variations.json"
        raise PosGPTError(
            f"pe={scheme}'s evaluation with eval.variations={variations} (from {source}; EVAL_VARIATIONS sets "
            f"others): {error}"
        ) from None


def planned_runs(study: Study) -> list[tuple[str, str, str]]:
    """(task, scheme, its variations) of every scheme that train.py accepts, each task in turn; a refused one said
    in one line on stderr. The evaluation with its variations that follows each run is checked too."""
    runs = []
    for task in study.tasks:
        for scheme in study.schemes:
            refusal = verdict(scheme, study.seeds, study.train_args(task))
            if refusal is not None:
                skipped = f"study: pe={scheme} is refused with these settings; its runs are skipped ({refusal})"
                print(skipped, file=sys.stderr)
                continue
            variations = variations_of(scheme)
            if variations:
                check_variations(scheme, variations, study.train_args(task))
            runs.append((task, scheme, variations))
    if not runs:
        raise PosGPTError("every scheme is refused with these settings (the lines above say why); nothing was trained")
    return runs


def variations_of(scheme: str) -> str:
    """The eval.variations a study evaluates the scheme's runs with (scripts/study_variations.py); $EVAL_VARIATIONS
    replaces them for every scheme that has some."""
    declared = STUDY_VARIATIONS.get(scheme, ())
    if not declared:
        return ""
    return os.environ.get("EVAL_VARIATIONS") or f"[{','.join(declared)}]"


def make_folder(folder: str) -> None:
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        kind = PosGPTError if error.errno in COMMAND_ERRORS else MachineFault
        raise kind(f"cannot make the study directory {folder}: {error.strerror}") from None


def plan_fields(study: Study, runs: list[tuple[str, str, str]], listing: bool) -> list[str]:
    kind = "text" if study.tasks == [NO_TASK] else "tasks"
    fields = [study.folder, kind, "list" if listing else "train"]
    for task, scheme, variations in runs:
        for seed in study.seeds:
            train_args = [*study.train_args(task), f"pe={scheme}", f"train.seed={seed}"]
            fields += [study.run_dir(task, scheme, seed), task, scheme, variations, str(len(train_args)), *train_args]
    return fields


@exit_on_user_error
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    study = study_of(args)
    check_outputs({"--plan-to": args.plan_to})
    check_writable({"--plan-to": args.plan_to})
    check_folder("the study directory", study.folder)
    from experiment.compose import hydra_errors_as_user_errors

    with hydra_errors_as_user_errors():
        runs = planned_runs(study)
    if not args.list:
        make_folder(study.folder)
    atomic_write(args.plan_to, "\0".join(plan_fields(study, runs, args.list)).encode())
    if args.list:  # the runs it would make: every job planned above, the refused schemes left out
        print("\n".join(study.run_dir(task, scheme, seed) for task, scheme, _ in runs for seed in study.seeds))


if __name__ == "__main__":
    unwind_on_sigterm()
    main(sys.argv[1:])
