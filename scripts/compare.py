"""Compare how several runs extrapolate, over seeds: one markdown table and one perplexity-vs-length plot.

    python scripts/compare.py multirun/study/*/                         # -> comparison.md, comparison.png
    python scripts/compare.py run_a run_b --protocol sliding --markdown out.md --plot out.png
    python scripts/compare.py runs/*/ --per-position per_position.png   # loss by position, one line per setting
    python scripts/compare.py runs/*/ --ratios                          # also ppl@kL / ppl@L per setting
    python scripts/compare.py runs/*/ --entropy entropy.png            # attention entropy (inspect_attention.py)
    python scripts/compare.py runs/*/ --val-curve val.png              # validation loss during training, per setting
    python scripts/compare.py runs/*/ --baseline rope                   # paired differences against rope
    python scripts/compare.py tasks/passkey-*/ --task-plot acc.png      # task runs: accuracy over seeds
    python scripts/compare.py tasks/*/ --task-heatmap grid.png          # task runs: settings x lengths, per task
    python scripts/compare.py tasks/*/ --ecl-absolute 0.9               # effective context length at accuracy 0.9

Reads each run's <run_dir>/eval/extrapolation.json (written by the eval at the end of training and by eval.py) and
the config the run was trained with (its checkpoint's; without checkpoints, the one its extrapolation.json records,
so results copied without them still compare: reports/runs.py, run_config). Runs whose configs differ only in
``train.seed`` (and in settings that do not change the trained model: logging, evaluation, threads, ...) and whose
results scored checkpoints of one step are seeds of one setting. Table rows: one per setting and evaluation-time
variation ("rope", "rope yarn:16", "alibi", "rope pe.base=500000" when settings of one scheme differ in a key); columns:
evaluation lengths; cells: the mean perplexity over seeds ± the half-width of its 95% Student-t confidence interval
(one seed: the value alone), the lowest mean of each column in bold; "n/a" where the scheme cannot run at that
length (learned beyond its table), "-" where it was not evaluated. Below the table: which differences exceed their
intervals, the protocol, the data and the scored token ranges (cells scored on different tokens are flagged);
paired by seed, every setting against the lowest in each column, or against ``--baseline`` (a row's label).

What is averaged: the rows of a setting's seeds are pooled only where they scored the same thing and were
computed alike, as evaluation/results.py's group_by_scored tells: the same corpus content (each row's
split_digest), the same split, the same targets (target_range), the same attention backend and dtype.
Otherwise they are separate table rows, each with only its own seeds, and labelled by what differs:
"rope [corpus 3fa2c1d9e0]", "rope [split all]", "rope [targets [2048, 34816))", "rope [math float32]"
(backend and dtype are named when they differ within a setting; across settings, a note lists them, since
the default attention path on a GPU depends on how a scheme enters attention). Differences and paired ratios
are computed only between rows that scored the same tokens. Rows that do not record the corpus's digest, backend
and dtype read as "unrecorded": they pool with each other when their data
name, corpus description, split and targets agree (a study evaluated alike, as before), never with rows whose digest is
recorded. A seed whose perplexity overflows (a diverged run: ppl inf) makes its cell inf, with no interval.

Tasks: a run's eval/tasks.json (evaluation/task_accuracy.py: a task run's accuracy, which has no extrapolation.json;
a language-model run's copy probe, beside its perplexity) adds a section per task identity, "## Task: passkey
(filler_len=5, key_len=4, n_symbols=10)": the task and its settings as trained (the copy probe: its span and
the text it was written into), so runs of other task settings are never pooled nor compared. In it, per
measure (exact-match accuracy; the copy probe's mean log-probability too) and per grid cell (passkey: random
depth, then each depth; the copy probe: each distance), a table as above: mean over seeds ± 95% CI by length,
the highest mean in bold, which intervals are apart from the highest's, and the differences paired by seed
(value − the highest's, or --baseline's, in accuracy points: a ratio means nothing at accuracy 0). Settings are
found and labelled among the runs of one task. Also written: --task-csv (every cell, with each seed's value)
and --task-plot (accuracy vs length with its CI band, a panel per task identity, at random depth or the first
grid cell), and --task-heatmap (the accuracy table of each task identity as a grid of settings × lengths, a panel
per task, the mean over seeds printed in each cell), and where the rows have a depth grid (passkey),
--task-depth-heatmap (accuracy by depth x length, mean over seeds, a panel per setting). After the task sections,
"## Effective context length (accuracy ≥ 0.5; accuracy ≥ 0.9 × 1×)": per task and setting (random depth), each
seed's longest evaluated length up to which accuracy stays at or above a threshold at every evaluated length
(RULER's effective length: the first failure ends it), absolute (--ecl-absolute, default 0.5) and relative to the
seed's own 1x accuracy (--ecl-relative, default 0.9), mean over seeds ± 95% CI and each seed's; --task-csv holds
them too (reports/task_tables.py: effective_length_report). The perplexity outputs are written only for runs that
have perplexity.

Key-token perplexity (LongPPL, eval.key_tokens=true: evaluation/key_tokens.py): where the runs have its rows for the
protocol compared, a section "## Key-token perplexity" after the perplexity tables: key-token perplexity by length over
seeds with its differences and pairing as above, and the share of the targets that were key tokens
(reports/key_tokens.py). Rows selected otherwise (thresholds, short context, evaluator) are never pooled.

It plans, then writes: every run's results, every option (--per-position's bins, --entropy's attention files,
--val-curve's logs, --baseline) and every output path (an image where it is a plot, not over an input, writable) is
read and checked, and every table and series computed, before the first file is written; a refused comparison
writes nothing.

This file is the command; what it computes lives in reports/ (reports/__init__.py lists its modules).
"""

from __future__ import annotations

import _repo
from core.interrupts import unwind_on_sigterm

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from core.cli import ArgumentParser, count, exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, check_matplotlib_folders, check_outputs, check_writable
from evaluation.attention_stats import plot_entropy_comparison, read_attention
from evaluation.extrapolation import PROTOCOLS
from evaluation.plots import (
    Series,
    bins_note,
    check_image_paths,
    plot_per_position,
    plot_ppl_vs_length,
    plot_task_heatmaps,
    plot_task_panels,
    plot_training_curves,
)
from evaluation.results import row_ppl
from experiment.settings import trained_config
from reports.curves import ValidationCurve, validation_curves, validation_report
from reports.key_tokens import key_token_entries, key_token_report
from reports.metrics import metric_report
from reports.perplexity import (
    choose_data,
    entries_of,
    longest_evaluated_length,
    markdown_report,
    per_position_series,
    ppl_series,
)
from reports.runs import Entry, Run, group_by_seed, load_runs
from reports.tables import find_baseline
from reports.task_tables import (
    TaskEntry,
    Thresholds,
    effective_length_report,
    task_csv,
    task_depth_heatmap_panels,
    task_entries,
    task_heatmap_panels,
    task_panels,
    task_report,
)

DEFAULT_MARKDOWN = Path("comparison.md")  # the other outputs lie beside it (default_outputs)


# Which runs read each group of options: a language-model run's perplexity rows ("text"), a task run's accuracy
# ("task"), or any run (None). An option given for runs none of which reads it is refused (check_readers).
OPTION_GROUPS = {"selection": "text", "perplexity": "text", "task": "task", "any run": None}
# Options of the groups above that every run reads: the outputs and comparisons of any run's results.
READ_FOR_ANY_RUN = ("run_dirs", "markdown", "val_curve", "entropy", "baseline")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, str | None]]:
    """The parser, and the kind of run that reads each option's destination (OPTION_GROUPS; None: any run)."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    readers = {}
    # --help lists the options in the order they are added
    groups = ((add_selection_options, "selection"), (add_perplexity_options, "perplexity"), (add_task_options, "task"))
    for add, group in groups:
        before = len(parser._actions)
        add(parser)
        readers.update({action.dest: OPTION_GROUPS[group] for action in parser._actions[before:]})
    readers.update(dict.fromkeys(READ_FOR_ANY_RUN))
    return parser, readers


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, with ``given``: each option the command line sets away from its default, and the kind of run
    that reads it (build_parser), for check_readers."""
    parser, readers = build_parser()
    args = parser.parse_args(argv)
    args.given = {
        action.option_strings[-1]: readers[action.dest]
        for action in parser._actions
        if action.option_strings and action.dest != "help" and getattr(args, action.dest) != action.default
    }
    for name, path in default_outputs(args.markdown).items():
        if getattr(args, name) is None:
            setattr(args, name, path)
    return args


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """The runs, and which of their results are compared."""
    parser.add_argument("run_dirs", nargs="+", type=Path, help="training run directories")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="nonoverlapping")
    parser.add_argument(
        "--stride",
        type=count(1),  # eval.stride's domain: a 0 would read as no stride (half of each length), and exit 0
        default=None,
        help="sliding protocol: the stride evaluated (default: half of each length, eval's default)",
    )
    parser.add_argument("--data", default=None, help="compare results on this data (default: the only one)")


def add_perplexity_options(parser: argparse.ArgumentParser) -> None:
    """The markdown and the perplexity outputs, the tables and plots added to them, and the paired baseline."""
    parser.add_argument("--markdown", type=Path, default=DEFAULT_MARKDOWN, help="table output path")
    parser.add_argument(
        "--plot", type=Path, default=None, help="plot output path (default: the --markdown path with .png)"
    )
    parser.add_argument(
        "--per-position",
        type=Path,
        default=None,
        help="also plot loss by position at the longest evaluated length to this path",
    )
    parser.add_argument(
        "--ratios",
        action="store_true",
        help="also tabulate ppl@kL / ppl@L (L: the training length), per seed then mean ± CI",
    )
    parser.add_argument(
        "--val-curve",
        type=Path,
        default=None,
        help="also plot the validation loss logged during training (metrics.jsonl), mean ± CI over "
        "seeds per setting, to this path, and tabulate it in the markdown",
    )
    parser.add_argument(
        "--entropy",
        type=Path,
        default=None,
        help="also overlay the runs' attention entropy by position (eval/attention.json, written "
        "by scripts/inspect_attention.py), one colour per scheme, to this path",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="pair every setting by seed with this one (a row label: a scheme, or a scheme and a variation) "
        "instead of the lowest in each column",
    )


def add_task_options(parser: argparse.ArgumentParser) -> None:
    """The outputs of task runs (eval/tasks.json)."""
    parser.add_argument(
        "--task-plot",
        type=Path,
        default=None,
        help="task runs (eval/tasks.json): accuracy vs length, a panel per task, to this path "
        "(default: the --markdown path with _tasks.png)",
    )
    parser.add_argument(
        "--task-heatmap",
        type=Path,
        default=None,
        help="task runs: mean accuracy over seeds as a grid of settings x lengths, a panel per task, to this "
        "path (default: the --markdown path with _tasks_heatmap.png)",
    )
    parser.add_argument(
        "--task-csv",
        type=Path,
        default=None,
        help="task runs: the task tables as CSV, to this path (default: the --markdown path with _tasks.csv)",
    )
    parser.add_argument(
        "--task-depth-heatmap",
        type=Path,
        default=None,
        help="task runs with a depth grid (passkey's eval.task_depths): mean accuracy over seeds by depth x length, "
        "a panel per setting, to this path (default: the --markdown path with _tasks_depth.png)",
    )
    parser.add_argument(
        "--ecl-absolute",
        type=share,
        default=None,
        help=f"task runs: the effective context length's absolute threshold, an accuracy in (0, 1] (default "
        f"{Thresholds.absolute})",
    )
    parser.add_argument(
        "--ecl-relative",
        type=share,
        default=None,
        help="task runs: the effective context length's relative threshold, a share in (0, 1] of each seed's "
        f"accuracy at 1x (default {Thresholds.relative})",
    )


def share(text: str) -> float:
    """An argparse ``type``: a number in (0, 1] (an accuracy, or a share of one)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:  # a NaN is refused too: it compares False
        raise argparse.ArgumentTypeError(f"{text} is out of its domain (0, 1]")
    return value


def default_outputs(markdown: Path) -> dict[str, Path]:
    """The outputs written beside the markdown, named after it, where their option names no other path."""
    return {
        "plot": markdown.with_suffix(".png"),
        "task_plot": markdown.with_name(f"{markdown.stem}_tasks.png"),
        "task_heatmap": markdown.with_name(f"{markdown.stem}_tasks_heatmap.png"),
        "task_csv": markdown.with_name(f"{markdown.stem}_tasks.csv"),
        "task_depth_heatmap": markdown.with_name(f"{markdown.stem}_tasks_depth.png"),
    }


def thresholds_of(args: argparse.Namespace) -> Thresholds:
    """The effective context length's thresholds: the options given, the defaults for the others."""
    given = {"absolute": args.ecl_absolute, "relative": args.ecl_relative}
    return Thresholds(**{name: value for name, value in given.items() if value is not None})


def check_readers(given: dict[str, str | None], text: bool, tasks: bool) -> None:
    """Refuse an option given for runs none of which reads it (a plot of perplexity for task runs, a task table's
    option for language-model runs): it would write nothing for it and exit 0."""
    present = {"text": text, "task": tasks}
    for option, kind in given.items():
        if kind is not None and not present[kind]:
            theirs, other = ("language-model", "task") if kind == "text" else ("task", "language-model")
            raise PosGPTError(
                f"{option} is read for {theirs} runs, and these are {other} runs only: drop it (nothing was written)"
            )


def check_task_requests(args: argparse.Namespace, tasks: list[TaskEntry]) -> None:
    """Refuse an effective-length threshold where no task run has accuracy by length off a grid to find one in."""
    for name in ("ecl_absolute", "ecl_relative"):
        if getattr(args, name) is not None and not any(entry.cell is None for entry in tasks):
            raise PosGPTError(
                f"{option_name(name)}: no task run has accuracy by length (eval/tasks.json, off any grid) to find "
                "an effective length in; leave it out or compare task runs"
            )


def check_requests(args: argparse.Namespace, entries: list[Entry]) -> None:
    """Refuse, before anything is written, an option asking for a table or plot these runs cannot fill."""
    if args.per_position is not None and longest_evaluated_length(entries) is None:
        raise PosGPTError("--per-position: no run has a scored row to draw; leave it out or evaluate the runs")
    if args.ratios and not any(
        length > entry.train_len and entry.train_len in seed
        for entry in entries
        for seed in entry.per_seed
        for length in seed
    ):
        raise PosGPTError(
            "--ratios: no run was evaluated both at its training length and beyond it; leave it out or evaluate "
            "the runs at those lengths"
        )


def option_name(attribute: str) -> str:
    """``task_plot`` -> ``--task-plot``."""
    return "--" + attribute.replace("_", "-")


@dataclass
class Comparison:
    """Everything a comparison writes, computed and checked before the first file is: a refusal leaves no output."""

    report: str
    entries: list[Entry]  # the perplexity settings (none for task runs alone)
    data: str | None
    tasks: list[TaskEntry]
    curves: list[ValidationCurve]  # with --val-curve
    per_position: list[Series] | None  # with --per-position, at per_position_length
    per_position_length: int | None
    attention: list[tuple[str, dict]] | None  # with --entropy


@exit_on_user_error
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    write_comparison(args, plan_comparison(args))


def plan_comparison(args: argparse.Namespace) -> Comparison:
    """Read and check every input, check every output path, and compute every table and series to draw: each
    refusal comes here, before anything is written."""
    if args.stride is not None and args.protocol != "sliding":
        raise PosGPTError(f"--stride is the sliding protocol's; pass --protocol sliding or drop --stride {args.stride}")
    runs = load_runs(args.run_dirs, trained_config)
    language_runs = [run for run in runs if run.document is not None]  # task runs have accuracy only
    tasks = task_entries(runs)
    check_readers(args.given, bool(language_runs), bool(tasks))
    check_task_requests(args, tasks)
    check_matplotlib_folders()  # before the image paths' check imports it
    check_output_paths(args, bool(language_runs), bool(tasks), bool(task_depth_heatmap_panels(tasks)))
    entries, data = [], None
    if language_runs:
        data = choose_data(language_runs, args.data)
        entries = entries_of(group_by_seed(language_runs), args.protocol, args.stride, data)
    check_requests(args, entries)
    check_baseline(args.baseline, entries, tasks)
    report, curves = comparison_markdown(args, runs, entries, data, tasks)
    length = longest_evaluated_length(entries) if args.per_position is not None else None
    per_position = per_position_series(entries, length) if length is not None else None
    attention = read_attention(args.run_dirs) if args.entropy is not None else None
    return Comparison(report, entries, data, tasks, curves, per_position, length, attention)


def write_comparison(args: argparse.Namespace, plan: Comparison) -> None:
    """Write the markdown and every plot the plan holds, printing the markdown."""
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.markdown, plan.report)
    print(plan.report)
    written = [args.markdown]
    if plan.tasks:
        write_task_outputs(args, plan.tasks, written)
    if plan.entries:
        write_perplexity_plots(args, plan, written)
    if plan.curves:
        write_validation_plot(args, plan.curves, written)
    if plan.attention is not None:
        args.entropy.parent.mkdir(parents=True, exist_ok=True)
        plot_entropy_comparison(plan.attention, args.entropy)
        written.append(args.entropy)
    print(f"compare: wrote {', '.join(map(str, written))}")


def check_output_paths(args: argparse.Namespace, perplexity: bool, tasks: bool, depths: bool = False) -> None:
    """Checked before anything is written: only the outputs these runs have (a task study writes no perplexity
    plot, a task without a depth grid no depth heatmap), each an image where it is a plot, none over an input or
    another run's files, and each writable."""
    outputs = ["markdown", "val_curve", "entropy"]
    outputs += ["plot", "per_position"] if perplexity else []
    outputs += ["task_plot", "task_heatmap", "task_csv"] if tasks else []
    outputs += ["task_depth_heatmap"] if depths else []
    check_image_paths(
        {option_name(name): getattr(args, name) for name in outputs if name not in ("markdown", "task_csv")}
    )
    paths = {option_name(name): getattr(args, name) for name in outputs}
    check_outputs(paths, inputs=args.run_dirs)
    check_writable(paths)


def check_baseline(baseline: str | None, entries: list[Entry], tasks: list[TaskEntry]) -> None:
    """Refuse a --baseline that names no setting of task runs, or only settings of one seed, as find_baseline
    does with perplexity runs (which it checks)."""
    if baseline is None or entries:
        return
    named = [entry for entry in tasks if entry.label == baseline]
    if not named:
        labels = ", ".join(repr(label) for label in dict.fromkeys(entry.label for entry in tasks))
        raise PosGPTError(f"--baseline {baseline!r} is not a setting of these runs; they are: {labels}")
    if all(len(entry.per_seed) < 2 for entry in named):
        raise PosGPTError(f"--baseline {baseline!r} has one seed: there is nothing to pair by seed")


def comparison_markdown(
    args: argparse.Namespace, runs: list[Run], entries: list[Entry], data: str | None, tasks: list[TaskEntry]
) -> tuple[str, list[ValidationCurve]]:
    """The markdown (perplexity tables, validation losses, task tables) and the validation curves it tabulates."""
    report = ""
    if entries:
        report = markdown_report(
            entries, args.protocol, args.stride, data, args.ratios, find_baseline(entries, args.baseline)
        )
        # key-token perplexity (eval.key_tokens): a section of its own where the runs have its rows
        language_runs = group_by_seed([run for run in runs if run.document is not None])
        key_entries = key_token_entries(language_runs, args.protocol, args.stride, data)
        if key_entries:
            report += key_token_report(key_entries, args.protocol, args.baseline)
    curves = validation_curves(group_by_seed(runs)) if args.val_curve is not None else []
    if curves:
        report += "\n" + validation_report(curves)
    if tasks:
        report += ("\n" if report else "") + task_report(tasks, args.baseline)
        effective = effective_length_report(tasks, thresholds_of(args))  # after every task's tables
        report += ("\n" + effective) if effective else ""
    report += metric_report(runs)  # plug-in evaluators' rows, where the runs have them
    return report, curves


def write_task_outputs(args: argparse.Namespace, tasks: list[TaskEntry], written: list[Path]) -> None:
    """The task plot, heatmap and CSV; each added to ``written``."""
    for path in (args.task_csv, args.task_plot, args.task_heatmap):
        path.parent.mkdir(parents=True, exist_ok=True)
    seeds = sorted({len(entry.per_seed) for entry in tasks})
    band = "; band: 95% CI over seeds" if seeds[-1] > 1 else ""
    plot_task_panels(
        task_panels(tasks), args.task_plot, "Task results by evaluation length", f"dashed: the training length{band}"
    )
    written += [task_csv(tasks, args.task_csv, thresholds_of(args)), args.task_plot]
    heatmaps = task_heatmap_panels(tasks)
    if heatmaps:  # a copy probe alone has no accuracy worth a grid
        caption = (
            f"cell: exact match, mean over the seeds with a value ({seed_counts(tasks)} a setting; intervals and cells "
            "with fewer: the markdown); blank: no value; white line: the training length"
        )
        plot_task_heatmaps(heatmaps, args.task_heatmap, "Exact match by evaluation length", caption)
        written.append(args.task_heatmap)
    write_depth_heatmap(args.task_depth_heatmap, tasks, written)


def write_depth_heatmap(path: Path, tasks: list[TaskEntry], written: list[Path]) -> None:
    """The depth x length heatmap, a panel per setting, where the task rows have a depth grid; added to ``written``."""
    panels = task_depth_heatmap_panels(tasks)
    if not panels:
        return
    over = seed_counts([entry for entry in tasks if entry.cell is not None and entry.cell[0] == "depth"])
    caption = (
        f"a panel per task and setting; row: the key's depth (share of the filler before it); cell: exact match, mean "
        f"over the seeds with a value ({over} a setting; intervals: the markdown); blank: no value; white line: the "
        "training length"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_task_heatmaps(panels, path, "Exact match by key depth and evaluation length", caption)
    written.append(path)


def seed_counts(entries: list[TaskEntry]) -> str:
    """How many seeds the settings have: "3", or "2-3" where they differ."""
    seeds = sorted({len(entry.per_seed) for entry in entries})
    return f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"


def write_validation_plot(args: argparse.Namespace, curves: list[ValidationCurve], written: list[Path]) -> None:
    """The validation loss during training, per setting; added to ``written``."""
    args.val_curve.parent.mkdir(parents=True, exist_ok=True)
    band = "band: 95% CI over seeds; " if max(curve.seeds for curve in curves) > 1 else ""
    plot_training_curves(
        [
            Series(
                curve.label,
                curve.scheme,
                list(curve.by_step),
                [estimate.mean for estimate in curve.by_step.values()],
                [estimate.half_width for estimate in curve.by_step.values()],
            )
            for curve in curves
        ],
        args.val_curve,
        "Validation loss during training",
        f"{band}at the training length, every train.val_every steps",
    )
    written.append(args.val_curve)


def write_perplexity_plots(args: argparse.Namespace, plan: Comparison, written: list[Path]) -> None:
    """The perplexity plot and, with --per-position, the loss by position; each added to ``written``."""
    entries = plan.entries
    train_lens = {entry.train_len for entry in entries}
    seeds = sorted({len(entry.per_seed) for entry in entries})
    band = "; band: 95% CI over seeds" if seeds[-1] > 1 else ""
    scored = f"{args.protocol} protocol, data {plan.data}"
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot_ppl_vs_length(ppl_series(entries), train_lens, args.plot, "Perplexity by evaluation length", f"{scored}{band}")
    written.append(args.plot)
    if plan.per_position is not None:
        length = plan.per_position_length
        args.per_position.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            seed[length]
            for entry in entries
            for seed in entry.per_seed
            if length in seed and row_ppl(seed[length]) is not None
        ]
        plot_per_position(
            plan.per_position,
            train_lens,
            args.per_position,
            f"Loss by position in windows of {length}",
            f"{scored}{band}; {bins_note(rows)} per seed",
        )
        written.append(args.per_position)


if __name__ == "__main__":
    unwind_on_sigterm()  # SIGTERM unwinds: an atomic write in progress leaves no temporary file
    main(sys.argv[1:])
