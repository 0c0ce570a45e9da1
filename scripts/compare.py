"""Compare how several runs extrapolate, over seeds: one markdown table and one perplexity-vs-length plot.

    python scripts/compare.py multirun/study/*/                         # -> comparison.md, comparison.png
    python scripts/compare.py run_a run_b --protocol sliding --markdown out.md --plot out.png
    python scripts/compare.py runs/*/ --per-position per_position.png   # loss by position, one line per setting
    python scripts/compare.py runs/*/ --ratios                          # also ppl@kL / ppl@L per setting
    python scripts/compare.py runs/*/ --entropy entropy.png            # attention entropy (inspect_attention.py)
    python scripts/compare.py runs/*/ --val-curve val.png              # validation loss during training, per setting
    python scripts/compare.py runs/*/ --baseline rope                   # paired differences against rope
    python scripts/compare.py tasks/passkey-*/ --task-plot acc.png      # task runs: accuracy over seeds

Reads each run's <run_dir>/eval/extrapolation.json (written by the eval at the end of training and by eval.py) and
the config the run was trained with (its checkpoint's; without checkpoints, the one its extrapolation.json records,
so results copied without them still compare: run_config). Runs whose configs differ only in ``train.seed`` (and in
settings that do not change the trained model: logging, evaluation, threads, ...) and whose results scored
checkpoints of one step are seeds of one setting. Table rows: one per setting and evaluation-time variation
("rope", "rope yarn:16", "alibi", "rope pe.base=500000" when settings of one scheme differ in a key); columns:
evaluation lengths; cells: the mean perplexity over seeds ± the half-width of its 95% Student-t confidence interval
(one seed: the value alone), the lowest mean of each column in bold; "n/a" where the scheme cannot run at that
length (learned beyond its table), "-" where it was not evaluated. Below the table: which differences exceed their
intervals, the protocol, the data and the scored token ranges (cells scored on different tokens are flagged);
paired by seed, every setting against the lowest in each column, or against ``--baseline`` (a row's label).

What is averaged: the rows of a setting's seeds are pooled only where they scored the same thing and were
computed alike, as evaluation/report.py's group_by_scored tells: the same corpus content (each row's
split_digest), the same split, the same targets (target_range), the same attention backend and dtype.
Otherwise they are separate table rows, each with only its own seeds, and labelled by what differs:
"rope [corpus 3fa2c1d9e0]", "rope [split all]", "rope [targets [2048, 34816))", "rope [math float32]"
(backend and dtype are named when they differ within a setting; across settings, a note lists them, since
e.g. ALiBi runs flex and RoPE sdpa by default on a GPU). Differences and paired ratios are computed only
between rows that scored the same tokens. Rows written before posgpt recorded the corpus's digest, backend
and dtype (before 2026-11-24) read as "unrecorded": they pool with each other when their data name, corpus
description, split and targets agree (a study evaluated alike, as before), never with rows whose digest is
recorded. A seed whose perplexity overflows (a diverged run: ppl inf) makes its cell inf, with no interval.

Tasks: a run's eval/tasks.json (evaluation/tasks.py: a task run's accuracy, which has no extrapolation.json;
a language-model run's copy probe, beside its perplexity) adds a section per task identity, "## Task: passkey
(filler_len=5, key_len=4, n_symbols=10)": the task and its settings as trained (the copy probe: its span and
the text it was written into), so runs of other task settings are never pooled nor compared. In it, per
measure (exact-match accuracy; the copy probe's mean log-probability too) and per grid cell (passkey: random
depth, then each depth; the copy probe: each distance), a table as above: mean over seeds ± 95% CI by length,
the highest mean in bold, which intervals are apart from the highest's, and the differences paired by seed
(value − the highest's, or --baseline's, in accuracy points: a ratio means nothing at accuracy 0). Settings are
found and labelled among the runs of one task. Also written: --task-csv (every cell, with each seed's value)
and --task-plot (accuracy vs length with its CI band, a panel per task identity, at random depth or the first
grid cell). The perplexity outputs are written only for runs that have perplexity.
"""

from __future__ import annotations

import _repo

import argparse
import collections
import csv
import io
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from core.checkpoint_io import last_checkpoint_path, load_checkpoint
from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError
from core.files import atomic_write, check_outputs
from core.tracking import METRICS_FILE, read_metrics
from evaluation.attention_stats import plot_entropy_comparison, read_attention
from evaluation.extrapolation import PROTOCOLS, effective_stride
from evaluation.plots import (
    Series,
    bin_centre,
    bins_note,
    check_image_paths,
    plot_per_position,
    plot_ppl_vs_length,
    plot_task_panels,
    plot_training_curves,
)
from evaluation.report import (
    RUNTIME_FIELDS,
    SCORED_FIELDS,
    condition_label,
    format_estimate,
    group_by_scored,
    length_header,
    load_results,
    provenance,
    provenance_tags,
    render_table,
    row_ppl,
)
from evaluation.run import EVAL_DIR, load_run_results
from evaluation.stats import Estimate, clearly_different, mean_ci
from evaluation.tasks import GRIDS, PROBE_SETTINGS, effective_lengths, grid_cell, probe_settings
from evaluation.tasks import JSON_FILE as TASKS_FILE
from evaluation.tasks import variation as row_variation
from experiment.settings import RESUME_SETTINGS, flatten_config, may_change, trained_config
from model.pe import display_name

# Config keys that do not make two runs different settings: the seed, and what a resumed run may change
# (logging, evaluation, threads, ...) except what changes the trained model (its length, its precision).
NOT_A_SETTING = ("train.seed",) + tuple(key for key in RESUME_SETTINGS if key not in ("train.max_steps", "train.dtype"))
DEFAULT_MARKDOWN = Path("comparison.md")  # the other outputs lie beside it (default_outputs)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="training run directories")
    parser.add_argument("--protocol", choices=PROTOCOLS, default="nonoverlapping")
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        help="sliding protocol: the stride evaluated (default: half of each length, eval's default)",
    )
    parser.add_argument("--data", default=None, help="compare results on this data (default: the only one)")
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
    parser.add_argument(
        "--task-plot",
        type=Path,
        default=None,
        help="task runs (eval/tasks.json): accuracy vs length, a panel per task, to this path "
        "(default: the --markdown path with _tasks.png)",
    )
    parser.add_argument(
        "--task-csv",
        type=Path,
        default=None,
        help="task runs: the task tables as CSV, to this path (default: the --markdown path with _tasks.csv)",
    )
    args = parser.parse_args(argv)
    for name, path in default_outputs(args.markdown).items():
        if getattr(args, name) is None:
            setattr(args, name, path)
    return args


def default_outputs(markdown: Path) -> dict[str, Path]:
    """The outputs written beside the markdown, named after it, where their option names no other path."""
    return {
        "plot": markdown.with_suffix(".png"),
        "task_plot": markdown.with_name(f"{markdown.stem}_tasks.png"),
        "task_csv": markdown.with_name(f"{markdown.stem}_tasks.csv"),
    }


def run_config(run_dir: Path, document: dict[str, Any]) -> dict[str, Any]:
    """The resolved config a run was trained with, from its checkpoint: the one source of truth (Hydra's
    .hydra/config.yaml can be rewritten by a later command aimed at the run). A directory without checkpoints
    (results copied elsewhere, as in results/) is read from the config its extrapolation.json records, which is
    the checkpoint's (evaluation/run.py). compare reads configs only here.

    The config is typed by today's schema, so that a setting added since a run was trained (absent from its
    config) reads as its default and does not set that run apart from newer ones."""
    if last_checkpoint_path(run_dir).is_file():
        saved = load_checkpoint(run_dir)["config"]
    elif document.get("config") is None:
        raise PosGPTError(
            f"{run_dir} has no checkpoint, and its {EVAL_DIR}/extrapolation.json (written before "
            "posgpt recorded the trained config there) does not say how the run was trained"
        )
    else:
        saved = document["config"]
    return OmegaConf.to_container(trained_config(saved), resolve=True)


@dataclass
class Run:
    """A training run: its eval/extrapolation.json (None for a task run, which has none), its trained config, and
    its eval/tasks.json where it has one (a task run's accuracy, or a language-model run's copy probe)."""

    dir: Path
    document: dict[str, Any] | None
    config: dict[str, Any]
    tasks: dict[str, Any] | None = None

    @property
    def pe(self) -> str:
        return (self.document or self.tasks)["pe"]

    @property
    def step(self) -> int:
        """The training step of the checkpoint its results scored."""
        return (self.document or self.tasks)["step"]


@dataclass
class Entry:
    """A table row: one setting (seeds pooled), variation and what was scored (report.scored_identity);
    per_seed holds {length: row} per seed, and seeds the train.seed of each (what pairs it with other
    settings' runs)."""

    label: str
    scheme: str
    train_len: int
    per_seed: list[dict[int, dict[str, Any]]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    scored: tuple | None = None

    def example(self) -> dict[str, Any] | None:
        """A row that shows what this entry scored (a scored one where there is one)."""
        rows = [row for seed in self.per_seed for row in seed.values()]
        return next((row for row in rows if row.get("target_range")), rows[0] if rows else None)

    def same_tokens(self, other: Entry) -> bool:
        """Whether both scored the same corpus content, split and targets (backend and dtype aside)."""
        return self.scored is None or other.scored is None or _tokens(self.scored) == _tokens(other.scored)


def _tokens(scored: tuple) -> tuple:
    content, split, _, _, targets = scored  # report.scored_identity: (content, split, backend, dtype, targets)
    return content, split, targets


def load_runs(run_dirs: list[Path]) -> list[Run]:
    """Each run's results: extrapolation.json, and tasks.json where there is one (a task run has only that)."""
    runs = []
    for run_dir in run_dirs:
        tasks = load_task_results(run_dir)
        document = load_run_results(run_dir) if tasks is None else load_results(Path(run_dir) / EVAL_DIR)
        if document is not None and tasks is not None and document["step"] != tasks["step"]:
            raise PosGPTError(
                f"{run_dir}: its perplexity scored the checkpoint of step {document['step']}, its tasks.json that "
                f"of step {tasks['step']}: evaluate it again (python eval.py run_dir={run_dir} ...)"
            )
        runs.append(Run(run_dir, document, run_config(run_dir, document or tasks), tasks))
    return runs


def setting(run: Run) -> dict[str, str]:
    """The flattened config without the keys that do not make a different setting (NOT_A_SETTING), and the step
    scored: checkpoints of one run at other steps (eval.py on a copy of step_N.pt) are other models."""
    kept = {
        key: json.dumps(value, sort_keys=True)
        for key, value in flatten_config(run.config).items()
        if not may_change(key, NOT_A_SETTING)
    }
    return {**kept, "step": json.dumps(run.step)}


def group_by_seed(runs: list[Run]) -> list[list[Run]]:
    """Runs with the same setting, in the order given; two runs of one setting with one seed are refused
    (the same run twice, or a rerun: counting both would fake a narrow interval)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        group = groups.setdefault(tuple(sorted(setting(run).items())), [])
        for other in group:
            if other.config["train"]["seed"] == run.config["train"]["seed"]:
                raise PosGPTError(
                    f"{other.dir} and {run.dir} are the same setting with the same train.seed "
                    f"({run.config['train']['seed']}): pass each run once, one per seed"
                )
        group.append(run)
    return list(groups.values())


# More keys than this tell a setting from the others of its scheme: it is named by its run directory instead.
MAX_LABEL_KEYS = 3


def group_labels(groups: list[list[Run]]) -> list[str]:
    """The scheme's name, plus the keys whose values tell this setting from others of the same scheme; a key's
    value that most of those settings share (more than any other value of it) is left out, so that among
    "rope", "rope model.attn_sink=True" and "rope model.attn_temperature.type=ssmax" the plain run reads "rope"
    (labels stay distinct: two settings differ in some key, and at most one of them holds its common value).
    When more than MAX_LABEL_KEYS keys differ (a fine-tuned run: its length, lr, steps, parent, ...), the name
    of its first run's directory instead, without a -s<seed> suffix, and with as many parent directories
    as it takes to tell it from the others (probes/h2/rope-s1 and probes/w128/rope-s1: "h2/rope", "w128/rope")."""
    settings = [setting(group[0]) for group in groups]
    details: list[list[str] | None] = []
    for group, own in zip(groups, settings):
        scheme = group[0].pe
        siblings = [other for g, other in zip(groups, settings) if g[0].pe == scheme]
        differing = sorted(key for key in own if any(other.get(key) != own[key] for other in siblings))
        shown = [key for key in differing if own[key] != common_value([other.get(key) for other in siblings])]
        details.append(None if len(differing) > MAX_LABEL_KEYS else [f"{key}={json.loads(own[key])}" for key in shown])
    named_by_dir = [i for i, detail in enumerate(details) if detail is None]
    for i, name in zip(named_by_dir, unique_dir_names([groups[i][0].dir for i in named_by_dir])):
        details[i] = [name]
    return [" ".join([display_name(group[0].pe)] + detail) for group, detail in zip(groups, details)]


def common_value(values: list[str | None]) -> str | None:
    """The value held more often than every other one (None where none is: a tie, or the key is absent)."""
    counts = collections.Counter(values).most_common(2)
    if len(counts) == 2 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0]


def unique_dir_names(dirs: list[Path]) -> list[str]:
    """Each run directory's name without its -s<seed> suffix, lengthened by parent directories until no
    other directory's name of the same length equals it; the whole path where even that is not enough."""
    parts = [dir.resolve().parts[:-1] + (re.sub(r"-s\d+$", "", dir.resolve().name),) for dir in dirs]
    names = []
    for i, own in enumerate(parts):
        others = [other for j, other in enumerate(parts) if j != i]
        depth = next((d for d in range(1, len(own) + 1) if all(other[-d:] != own[-d:] for other in others)), None)
        names.append("/".join(own[-depth:]) if depth else str(dirs[i].resolve()))  # x/rope-s1 vs x/rope-s2
    return names


def choose_data(runs: list[Run], data: str | None) -> str:
    available = sorted({str(row.get("data")) for run in runs for row in run.document["results"]})
    if data is None and len(available) == 1:
        return available[0]
    if data not in available:
        raise PosGPTError(f"choose the data to compare with --data (results exist for {', '.join(available)})")
    return data


def entries_of(groups: list[list[Run]], protocol: str, stride: int | None, data: str) -> list[Entry]:
    """One entry per (setting, variation, what was scored): the rows of the chosen protocol and data, pooled over
    the setting's seeds only where they scored the same tokens with the same backend and dtype (report.py's
    group_by_scored), so a seed that scored something else is an entry of its own, never averaged in. Entries
    are labelled by what differs (tag_entries)."""
    entries = []
    for group, label in zip(groups, group_labels(groups)):
        cells: dict[tuple, dict[int, dict[int, dict[str, Any]]]] = {}  # (variation, scored) -> run -> length -> row
        for i, run in enumerate(group):
            rows = [row for row in run.document["results"] if _wanted(row, protocol, stride, data)]
            for scored, members in group_by_scored(rows).items():
                for row in members:
                    # the streaming protocol's sinks (--protocol streaming), the variation, the temperature
                    sinks = f"k={row['sinks']}" if row.get("sinks") is not None else ""
                    key = (" ".join(filter(None, (sinks, condition_label(row)))), scored)
                    cells.setdefault(key, {}).setdefault(i, {})[row["length"]] = row
        if not cells:  # shown as a row of "-" rather than silently left out
            cells[("", None)] = {i: {} for i in range(len(group))}
        document = group[0].document
        for (variation, scored), by_run in sorted(cells.items(), key=lambda item: (item[0][0] != "", item[0][0])):
            runs = sorted(by_run)
            entries.append(
                Entry(
                    label + (f" {variation}" if variation else ""),
                    document["pe"],
                    document["train_seq_len"],
                    [by_run[i] for i in runs],
                    [group[i].config["train"]["seed"] for i in runs],
                    scored,
                )
            )
    if not any(seed for entry in entries for seed in entry.per_seed):
        raise PosGPTError(f"no {protocol} results on data {data} in these runs (try --protocol or --stride)")
    tag_entries(entries)
    return entries


def _wanted(row: dict[str, Any], protocol: str, stride: int | None, data: str) -> bool:
    wanted_stride = effective_stride(row["length"], stride) if protocol == "sliding" else None
    return row["protocol"] == protocol and row["stride"] == wanted_stride and str(row.get("data")) == data


def tag_entries(entries: list[Entry]) -> None:
    """Add "[...]" to the labels of entries that scored other tokens than the rest of the table (corpus
    content, split, targets), or that were computed otherwise (backend, dtype) than other entries of the same
    setting: what tells them apart, so no reader takes them for one measurement."""
    shown = [entry for entry in entries if entry.example() is not None]
    examples = [entry.example() for entry in shown]
    scored_tags = provenance_tags(examples, SCORED_FIELDS)
    runtime_tags = [""] * len(shown)
    for label in {entry.label for entry in shown}:
        same = [i for i, entry in enumerate(shown) if entry.label == label]
        for i, tag in zip(same, provenance_tags([examples[i] for i in same], RUNTIME_FIELDS)):
            runtime_tags[i] = tag
    for entry, *tags in zip(shown, scored_tags, runtime_tags):
        tag = " ".join(t for t in tags if t)
        entry.label += f" [{tag}]" if tag else ""


def runtime_note(entries: list[Entry]) -> str | None:
    """Which attention backend and dtype computed the rows, by setting where they differ; None when no row
    records them (results written before 2026-11-24)."""
    by_runtime: dict[str, list[str]] = {}
    for entry in entries:
        example = entry.example()
        if example is not None and (example.get("attn_backend") or example.get("dtype")):
            where = provenance(example)
            by_runtime.setdefault(f"{where['backend']}, {where['dtype']}", []).append(entry.label)
    if not by_runtime:
        return None
    if len(by_runtime) == 1:
        return f"Attention backend and dtype: {next(iter(by_runtime))} for every row."
    return (
        "Attention backend and dtype: "
        + "; ".join(f"{runtime} ({', '.join(labels)})" for runtime, labels in by_runtime.items())
        + ". A setting's seeds computed otherwise are separate rows, never averaged."
    )


def token_classes(entries: list[Entry]) -> list[list[Entry]]:
    """The entries in classes that scored the same tokens (Entry.same_tokens), in order of first appearance:
    differences and paired ratios are only computed within a class."""
    classes: list[list[Entry]] = []
    for entry in entries:
        home = next((c for c in classes if c[0].same_tokens(entry)), None)
        if home is None:
            classes.append([entry])
        else:
            home.append(entry)
    return classes


def ppl_values(entry: Entry, length: int) -> dict[int, float]:
    """{train.seed: perplexity at ``length``} over the seeds that have one there."""
    return {
        seed: row_ppl(rows[length])
        for seed, rows in zip(entry.seeds, entry.per_seed)
        if length in rows and row_ppl(rows[length]) is not None
    }


def ratio_values(entry: Entry, multiple: float) -> dict[int, float]:
    """{train.seed: ppl@kL / ppl@L}, each seed's ratio from its own two perplexities (none where ppl@L is inf:
    a seed diverged at its own length has no ratio)."""
    length = round(multiple * entry.train_len)
    ratios = {}
    for seed, rows in zip(entry.seeds, entry.per_seed):
        if length in rows and entry.train_len in rows:
            ppl, base = row_ppl(rows[length]), row_ppl(rows[entry.train_len])
            if ppl is not None and base is not None and math.isfinite(base):
                ratios[seed] = ppl / base
    return ratios


def ppl_estimate(entry: Entry, length: int) -> Estimate | None:
    """Mean ± CI of the perplexity at ``length`` over the seeds that have one there."""
    values = ppl_values(entry, length)
    return mean_ci(list(values.values())) if values else None


def ratio_estimate(entry: Entry, multiple: float) -> Estimate | None:
    """Mean ± CI over seeds of ppl@kL / ppl@L."""
    values = ratio_values(entry, multiple)
    return mean_ci(list(values.values())) if values else None


@dataclass(frozen=True)
class Reading:
    """How a measure's values are compared: which end of a column is best (``best``: min or max, named by
    ``best_word``), and how two settings' values of one seed are paired: ``ratio``, value / reference − 1
    (perplexity: a scale), or else the difference value − reference (accuracy: a share, often 0)."""

    best: Callable[..., Any] = min
    best_word: str = "lowest"
    ratio: bool = True


PERPLEXITY = Reading()
ACCURACY = Reading(max, "highest", ratio=False)  # also the mean log-probability: higher is better


def paired_estimate(
    entry: Entry,
    reference: Entry,
    column: Any,
    values: Callable[[Entry, Any], dict[int, float]],
    reading: Reading = PERPLEXITY,
) -> Estimate | None:
    """Mean ± CI over the seeds both settings ran of entry's value / reference's value − 1 (or their difference:
    Reading). Runs with the same train.seed train on the same batches (the same tokens in the same order:
    training/batch_stream.py draws them from a generator of their own; a task's examples likewise), so pairing
    cancels what the choice of training data does to both. None with fewer than two shared seeds. A seed where
    both are inf (both diverged) has no ratio."""
    own, theirs = values(entry, column), values(reference, column)
    shared = sorted(seed for seed in set(own) & set(theirs) if not (math.isinf(own[seed]) and math.isinf(theirs[seed])))
    if len(shared) < 2:
        return None
    if reading.ratio:
        return mean_ci([own[seed] / theirs[seed] - 1 for seed in shared])
    return mean_ci([own[seed] - theirs[seed] for seed in shared])


def find_baseline(entries: list[Entry], label: str | None) -> Entry | None:
    """The entry labelled ``label`` (None: no baseline); a PosGPTError listing the labels when there is none, or
    when it has one seed."""
    if label is None:
        return None
    baseline = next((entry for entry in entries if entry.label == label), None)
    if baseline is None:
        raise PosGPTError(
            f"--baseline {label!r} is not a setting of these runs; they are: "
            f"{', '.join(repr(entry.label) for entry in entries)}"
        )
    if len(baseline.per_seed) < 2:
        raise PosGPTError(f"--baseline {label!r} has one seed: there is nothing to pair by seed")
    return baseline


def paired_report(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    values: Callable[[Entry, Any], dict[int, float]],
    baseline: Entry | None = None,
    reading: Reading = PERPLEXITY,
) -> list[str]:
    """Per column, every setting against a reference, paired by seed: a table of the relative difference (or the
    difference: Reading; mean ± 95% CI over shared seeds) and, per column, which exceed their interval. The
    reference is ``baseline`` or else, per column, the best mean (lowest perplexity, highest accuracy) among the
    settings with at least two seeds (one seed cannot be paired)."""
    body, claims = [[entry.label] for entry in entries], []
    best = reading.best_word
    for column, title in zip(columns, header):
        means = {id(entry): mean_ci(list(v.values())).mean for entry in entries if len(v := values(entry, column)) > 1}
        if len(means) < 2 or (baseline is not None and id(baseline) not in means):
            for row in body:
                row.append("-")
            continue
        reference = baseline or next(entry for entry in entries if means.get(id(entry)) == reading.best(means.values()))
        worse, close = [], []
        for entry, row in zip(entries, body):
            if entry is reference:
                row.append("baseline" if baseline else best)
                continue
            estimate = paired_estimate(entry, reference, column, values, reading)
            if estimate is None:
                row.append("-")
                continue
            apart = estimate.low > 0 or estimate.high < 0
            (worse if apart else close).append(entry.label)
            bold = "**" if apart else ""
            if reading.ratio:
                row.append(f"{bold}{estimate.mean:+.1%} ± {estimate.half_width:.1%}{bold}")
            else:
                row.append(f"{bold}{estimate.mean:+.3f} ± {estimate.half_width:.3f}{bold}")
        claims.append(
            f"- {title}: {'baseline' if baseline else best} {reference.label}; interval excludes 0 "
            f"(clearly different): {', '.join(worse) or 'no setting'}; interval includes 0: "
            f"{', '.join(close) or 'no setting'}"
        )
    reference_text = f"the baseline's ({baseline.label})" if baseline else f"the {best} setting's"
    contrast = f"/ {reference_text} value − 1" if reading.ratio else f"− {reference_text} value"
    return [
        "",
        "Paired by seed (runs with the same train.seed train on the same batches): per "
        f"seed, a setting's value {contrast}, mean over the shared seeds ± 95% CI; "
        "bold where the interval excludes 0.",
        "",
        render_table(["setting"] + header, body, markdown=True),
        "",
        *claims,
    ]


def estimate_table(
    rows: list[tuple[str, int, list[Estimate | None | str]]],
    header: list[str],
    digits: int = 2,
    reading: Reading = PERPLEXITY,
) -> str:
    """A markdown table: a row per (label, number of seeds, cells), the best (lowest: Reading) mean of each column
    in bold. A cell is an Estimate, None (n/a: not evaluable there) or a string shown as is ("-": not evaluated)."""
    best = [
        reading.best((cells[i].mean for _, _, cells in rows if isinstance(cells[i], Estimate)), default=None)
        for i in range(len(header))
    ]
    body = []
    for label, seeds, cells in rows:
        texts = []
        for i, cell in enumerate(cells):
            text = cell if isinstance(cell, str) else format_estimate(cell, seeds, digits)
            texts.append(f"**{text}**" if isinstance(cell, Estimate) and cell.mean == best[i] else text)
        body.append([label, str(seeds)] + texts)
    return render_table(["setting", "seeds"] + header, body, markdown=True)


def table(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    estimate: Callable[[Entry, Any], Estimate | None],
    digits: int = 2,
    reading: Reading = PERPLEXITY,
) -> str:
    """A row per entry: its number of seeds and, per column, the estimate ("-" where no seed was evaluated)."""
    rows = [
        (
            entry.label,
            len(entry.per_seed),
            [
                estimate(entry, column) if any(column_key(column, entry) in seed for seed in entry.per_seed) else "-"
                for column in columns
            ],
        )
        for entry in entries
    ]
    return estimate_table(rows, header, digits, reading)


def column_key(column: Any, entry: Entry) -> int:
    """The length a column reads in an entry's rows: a length, or a multiple of the entry's training length."""
    return column if isinstance(column, int) else round(column * entry.train_len)


def differences(
    entries: list[Entry],
    columns: list[Any],
    header: list[str],
    estimate: Callable[[Entry, Any], Estimate | None],
    reading: Reading = PERPLEXITY,
) -> list[str]:
    """Per column: which settings' 95% intervals do not overlap the best one's (the rule in docs/evaluation.md)."""
    lines = []
    word = reading.best_word
    for column, title in zip(columns, header):
        scored = [(entry, estimate(entry, column)) for entry in entries]
        scored = [(entry, value) for entry, value in scored if value is not None]
        if len(scored) < 2:
            continue
        best_entry, best = reading.best(scored, key=lambda item: item[1].mean)
        if best.half_width is None:
            lines.append(f"- {title}: {word} {best_entry.label}, one seed: no interval, no difference claimed")
            continue
        worse = [e.label for e, v in scored if e is not best_entry and clearly_different(v, best)]
        close = [
            e.label
            for e, v in scored
            if e is not best_entry and v.half_width is not None and not clearly_different(v, best)
        ]
        unseeded = [e.label for e, v in scored if v.half_width is None]
        parts = [
            f"{word} {best_entry.label}",
            f"intervals apart (clearly worse): {', '.join(worse) or 'no setting'}",
            f"intervals overlap (not distinguishable): {', '.join(close) or 'no setting'}",
        ]
        if unseeded:
            parts.append(f"one seed, not compared: {', '.join(unseeded)}")
        lines.append(f"- {title}: " + "; ".join(parts))
    return lines


def markdown_report(
    entries: list[Entry], protocol: str, stride: int | None, data: str, ratios: bool, baseline: Entry | None = None
) -> str:
    lengths = sorted({length for entry in entries for seed in entry.per_seed for length in seed})
    train_lens = {entry.train_len for entry in entries}
    common_train_len = next(iter(train_lens)) if len(train_lens) == 1 else None
    header = length_header(lengths, common_train_len)
    if common_train_len is None:
        for entry in entries:
            entry.label += f" (trained at {entry.train_len})"
    stride_note = f", stride {stride or 'L/2'}" if protocol == "sliding" else ""
    rows = [row for entry in entries for seed in entry.per_seed for row in seed.values() if row_ppl(row) is not None]
    ranges = {tuple(row["target_range"]) + (row["tokens"],) for row in rows}
    classes = token_classes(entries)
    if len(classes) > 1:
        tokens_note = (
            "**rows marked [...] scored other tokens** (another corpus, split or target range): each is its own "
            "row, never averaged with the others, and differences are claimed only between rows that scored the "
            "same tokens"
        )
    elif len(ranges) == 1:
        start, stop, tokens = next(iter(ranges))
        tokens_note = f"every cell scores the same {tokens:,} tokens (targets [{start:,}, {stop:,}) of the split)"
    else:
        tokens_note = (
            "**cells scored different token ranges** "
            f"({', '.join(f'[{a:,}, {b:,})' for a, b, _ in sorted(ranges))}): compare with care"
        )
    parts = [
        f"Perplexity by evaluation length ({protocol} protocol{stride_note}; data: {data}; "
        f"training length {common_train_len or 'per row'}): mean over seeds ± half-width of the 95% confidence "
        "interval (Student t, n−1 degrees of freedom; one seed: the value alone; (n=k): only k seeds have "
        "a value there). n/a: not evaluable there (the run's extrapolation.json says why).",
        "",
        table(entries, lengths, header, ppl_estimate),
        "",
        f"Scored tokens: {tokens_note}.",
    ]
    note = runtime_note(entries)
    if note:
        parts += ["", note]
    rule = (
        "Differences: a setting differs from the lowest one at a length when their 95% intervals do not "
        "overlap (a conservative rule)."
    )
    if any(len(entry.per_seed) > 1 for entry in entries):
        parts += ["", rule, *by_class(classes, lambda c: differences(c, lengths, header, ppl_estimate))]
        parts += by_class(classes, lambda c: paired_report(c, lengths, header, ppl_values, baseline_in(c, baseline)))
    else:
        parts += [
            "",
            "One seed per setting: no intervals, so no difference is claimed (train more seeds, e.g. "
            "train.seed=1,2,3).",
        ]
    if ratios:
        multiples = sorted(
            {
                length / entry.train_len
                for entry in entries
                for seed in entry.per_seed
                for length in seed
                if length > entry.train_len
            }
        )
        ratio_header = [f"{k:g}×" for k in multiples]
        parts += [
            "",
            "Extrapolation ratio ppl@kL / ppl@L (L: the training length; per seed, then mean ± 95% CI):",
            "",
            table(entries, multiples, ratio_header, ratio_estimate, digits=3),
        ]
        if any(len(entry.per_seed) > 1 for entry in entries):
            parts += [
                "",
                rule.replace("at a length", "at a multiple"),
                *by_class(classes, lambda c: differences(c, multiples, ratio_header, ratio_estimate)),
            ]
            parts += by_class(
                classes, lambda c: paired_report(c, multiples, ratio_header, ratio_values, baseline_in(c, baseline))
            )
    return "\n".join(parts) + "\n"


def by_class(classes: list[list[Entry]], report: Callable[[list[Entry]], list[str]]) -> list[str]:
    """``report`` of each class of entries that scored the same tokens (token_classes); headed by what the
    class scored where there are several."""
    if len(classes) == 1:
        return report(classes[0])
    lines = []
    for members in (members for members in classes if len(members) > 1):
        lines += ["", f"Among the rows that scored the tokens of {', '.join(entry.label for entry in members)}:"]
        lines += report(members)
    alone = [members[0].label for members in classes if len(members) == 1]
    if alone:
        lines += ["", f"Not compared (no other row scored their tokens): {', '.join(alone)}."]
    return lines


def baseline_in(members: list[Entry], baseline: Entry | None) -> Entry | None:
    """The baseline where it is among ``members``; else None (the lowest of the class is the reference)."""
    return baseline if any(entry is baseline for entry in members) else None


def ppl_series(entries: list[Entry]) -> list[Series]:
    series = []
    for entry in entries:
        lengths = sorted({length for seed in entry.per_seed for length in seed})
        points = [  # an inf mean (a diverged seed) cannot be drawn: left out of the line, shown in the table
            (length, value)
            for length in lengths
            if (value := ppl_estimate(entry, length)) is not None and math.isfinite(value.mean)
        ]
        series.append(
            Series(
                entry.label,
                entry.scheme,
                [p[0] for p in points],
                [p[1].mean for p in points],
                [p[1].half_width for p in points],
            )
        )
    return series


def per_position_series(entries: list[Entry], length: int) -> list[Series]:
    """Per entry with rows at ``length``: per-bin mean loss over seeds, with its CI as the band."""
    series = []
    for entry in entries:
        rows = [seed[length] for seed in entry.per_seed if length in seed and row_ppl(seed[length]) is not None]
        if not rows:
            continue
        if any("per_position_bins" not in row for row in rows):
            raise PosGPTError(
                f"{entry.label}: results without per_position_bins (from an older posgpt); "
                "evaluate the runs again with eval.py"
            )
        bins = [[(b["positions"], b["loss"]) for b in row["per_position_bins"]] for row in rows]
        if any([p for p, _ in seed] != [p for p, _ in bins[0]] for seed in bins):
            raise PosGPTError(f"{entry.label}: the seeds' position bins differ (evaluated with other settings)")
        x, y, widths = [], [], []
        for i, (positions, _) in enumerate(bins[0]):
            losses = [seed[i][1] for seed in bins if seed[i][1] is not None]
            if losses:
                estimate = mean_ci(losses)
                x.append(bin_centre(*positions))
                y.append(estimate.mean)
                widths.append(estimate.half_width)
        series.append(Series(entry.label, entry.scheme, x, y, widths))
    return series


@dataclass
class ValidationCurve:
    """One setting's validation loss during training: {step: mean ± CI over its seeds}."""

    label: str
    scheme: str
    seeds: int
    by_step: dict[int, Estimate]
    runtimes: list[str] = field(default_factory=list)  # the attention backends and dtypes its seeds trained with


def validation_curves(groups: list[list[Run]]) -> list[ValidationCurve]:
    """Per setting, the validation loss each seed logged (metrics.jsonl), at the steps every seed logged."""
    curves = []
    for group, label in zip(groups, group_labels(groups)):
        per_seed, runtimes = [], {}
        for run in group:
            records = read_metrics(run.dir)
            logged = {
                record["step"]: record["val_loss"] for record in records if record.get("val_loss") is not None
            }  # a resumed run's repeated step: its last record
            # each start of a run records its backend and dtype (training/metrics.py); none before 2026-11-24
            runtimes.update({f"{r['attn_backend']}, {r['dtype']}": None for r in records if "attn_backend" in r})
            if not logged:
                raise PosGPTError(
                    f"{run.dir / METRICS_FILE} has no validation loss (train.val_every); "
                    "leave out --val-curve or this run"
                )
            per_seed.append(logged)
        steps = sorted(set.intersection(*(set(logged) for logged in per_seed)))
        if not steps:
            raise PosGPTError(
                f"{label}: its seeds logged validation loss at no common step (train.val_every "
                "differs); leave out --val-curve or compare runs logged alike"
            )
        curves.append(
            ValidationCurve(
                label,
                group[0].pe,
                len(group),
                {step: mean_ci([logged[step] for logged in per_seed]) for step in steps},
                list(runtimes),
            )
        )
    return curves


def validation_report(curves: list[ValidationCurve]) -> str:
    """The validation-loss table: a column per logged step, the lowest mean of each column in bold."""
    steps = sorted({step for curve in curves for step in curve.by_step})
    rows = [(curve.label, curve.seeds, [curve.by_step.get(step, "-") for step in steps]) for curve in curves]
    return (
        "\n".join(
            [
                "Validation loss during training (nats; the run's validation split at the training length, "
                "train.val_batches batches; mean over seeds ± half-width of the 95% CI), by training step:",
                "",
                estimate_table(rows, [str(step) for step in steps], digits=3),
                *training_runtime_note(curves),
            ]
        )
        + "\n"
    )


def training_runtime_note(curves: list[ValidationCurve]) -> list[str]:
    """The attention backend and dtype each setting trained with (metrics.jsonl), where recorded; a setting
    whose seeds trained otherwise is named (they are seeds of one setting: neither changes the trained model's
    definition, but a dtype changes its numbers)."""
    recorded = [curve for curve in curves if curve.runtimes]
    if not recorded:
        return []
    kinds = {runtime for curve in recorded for runtime in curve.runtimes}
    if len(kinds) == 1:
        return ["", f"Trained with attention backend and dtype {next(iter(kinds))} (every run that records it)."]
    return [
        "",
        "Trained with attention backend and dtype: "
        + "; ".join(
            f"{curve.label}: {' / '.join(curve.runtimes)}"
            + (" (its seeds differ: pooled above)" if len(curve.runtimes) > 1 else "")
            for curve in recorded
        )
        + ".",
    ]


def longest_evaluated_length(entries: list[Entry]) -> int | None:
    """The longest length any entry has a perplexity at (entries that cannot run there are left out)."""
    lengths = [L for entry in entries for seed in entry.per_seed for L, row in seed.items() if row_ppl(row) is not None]
    return max(lengths, default=None)


# Task accuracy: each run's eval/tasks.json (evaluation/tasks.py), aggregated over seeds like perplexity.

# The measures a task row may hold, with what they are; a table is made for each one some row has.
TASK_MEASURES = {
    "accuracy": "Exact-match accuracy",
    "mean_logprob": "Mean log-probability of the answer tokens (nats)",  # the copy probe's
    "copy_gain": "What the first copy adds to the repeat's mean log-probability (nats; 0: not used)",  # likewise
}
TASK_CSV_COLUMNS = ["task", "task_settings", "setting", *GRIDS, "length", "multiple", "measure", "seeds", "mean"]
TASK_CSV_COLUMNS += ["half_width", "ci_low", "ci_high", "values"]


def load_task_results(run_dir: Path) -> dict[str, Any] | None:
    """A run's eval/tasks.json, or None where it has none; a corrupt or malformed one is a PosGPTError naming it."""
    path = Path(run_dir) / EVAL_DIR / TASKS_FILE
    try:
        document = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):  # no such file, or run_dir is not a directory
        return None
    except (OSError, ValueError) as error:
        raise PosGPTError(f"{path} is unreadable or not JSON ({type(error).__name__}: {error})") from None
    needed = {"task", "pe", "train_seq_len", "results"}
    if not isinstance(document, dict) or not needed <= document.keys() or not isinstance(document["results"], list):
        raise PosGPTError(f"{path} is malformed: expected a JSON object with {', '.join(sorted(needed))}")
    for i, row in enumerate(document["results"]):  # what the tables read of a row
        number = (int, float, type(None))
        if not (
            isinstance(row, dict)
            and isinstance(row.get("task"), str)
            and isinstance(row.get("length"), int)
            and isinstance(row.get("n", 0), int)
            and all(isinstance(row.get(key), number) for key in (*TASK_MEASURES, *GRIDS))
        ):
            raise PosGPTError(f"{path} is malformed: result {i} lacks a task, an integer length or numeric values")
    return document


def task_identity(row: dict[str, Any], document: dict[str, Any]) -> str:
    """What a task row measured besides its length, grid cell and variation, in words: the task and its settings
    (a task run's, as trained: "passkey (filler_len=5, key_len=4, n_symbols=10)"), and for the copy probe the span
    and the text it was written into (data, corpus, split). Rows of different identities are never pooled nor
    compared: a passkey run with another key_len is another table."""
    settings = {key: value for key, value in (document.get("task_config") or {}).items() if key != "name"}
    if row.get("data") is not None:  # a probe of held-out text (every probe row records its text)
        # its settings (evaluation/tasks.py) other than their defaults (copy_min_count=0 draws from every token);
        # files from before 2026-11-24 record copy_span once, in the document
        probe = probe_settings({"copy_span": document.get("copy_span"), **row})
        settings.update({key: value for key, value in probe.items() if value != PROBE_SETTINGS[key]})
    described = ", ".join(f"{key}={value}" for key, value in sorted(settings.items()))
    return row["task"] + (f" ({described})" if described else "")


@dataclass
class TaskEntry(Entry):
    """A task table's row: one setting and variation (label), at one grid cell of one task identity."""

    identity: str = ""
    cell: tuple[str, float] | None = None  # evaluation/tasks.py grid_cell: ("depth", 0.5), None: no grid cell
    # per seed, (its effective length, the threshold that defines it: the run's eval.task_threshold); no grid cell only
    effective: list[tuple[int | None, float]] = field(default_factory=list)


def task_entries(runs: list[Run]) -> list[TaskEntry]:
    """One entry per (setting, variation, task identity, grid cell), its rows pooled over the setting's seeds;
    settings are found and labelled among the runs of one task ("rope", not "rope task.name=mqar ..."). In the
    order: identity, cell (none first), setting as given, variation (none first)."""
    by_task: dict[str, list[Run]] = {}
    for run in runs:
        if run.tasks is not None:
            by_task.setdefault(run.tasks["task"], []).append(run)
    entries = []
    for members in by_task.values():
        groups = group_by_seed(members)
        for group, label in zip(groups, group_labels(groups)):
            cells: dict[tuple, dict[int, dict[int, dict[str, Any]]]] = {}  # (identity, cell, variation) -> run -> ...
            for i, run in enumerate(group):
                for row in run.tasks["results"]:
                    key = (task_identity(row, run.tasks), grid_cell(row), row_variation(row))
                    cells.setdefault(key, {}).setdefault(i, {})[row["length"]] = row
            for (identity, cell, variation), by_run in sorted(cells.items(), key=lambda item: item[0][2] != ""):
                indices = sorted(by_run)
                effective = [  # as eval.py finds it, from the rows pooled here
                    (effective_lengths(list(by_run[i].values()), group[i].tasks["threshold"])[variation], threshold)
                    for i in indices
                    if cell is None and (threshold := group[i].tasks.get("threshold")) is not None
                ]
                entries.append(
                    TaskEntry(
                        label + (f" {variation}" if variation else ""),
                        group[0].pe,
                        group[0].tasks["train_seq_len"],
                        [by_run[i] for i in indices],
                        [group[i].config["train"]["seed"] for i in indices],
                        identity=identity,
                        cell=cell,
                        effective=effective,
                    )
                )
    identities = list(dict.fromkeys(entry.identity for entry in entries))
    return sorted(entries, key=lambda e: (identities.index(e.identity), e.cell is not None, e.cell or ("", 0.0)))


def task_values(measure: str) -> Callable[[Entry, int], dict[int, float]]:
    """{train.seed: the row's ``measure``} at a length, over the seeds with a value there (None: not evaluable)."""

    def values(entry: Entry, length: int) -> dict[int, float]:
        return {
            seed: rows[length][measure]
            for seed, rows in zip(entry.seeds, entry.per_seed)
            if length in rows and rows[length].get(measure) is not None
        }

    return values


def task_estimate(measure: str) -> Callable[[Entry, int], Estimate | None]:
    """Mean ± CI over seeds of ``measure`` at a length (None where no seed has a value)."""
    values = task_values(measure)

    def estimate(entry: Entry, length: int) -> Estimate | None:
        found = values(entry, length)
        return mean_ci(list(found.values())) if found else None

    return estimate


def task_tables(entries: list[TaskEntry]) -> list[tuple[str, list[TaskEntry], list[tuple[str, list[TaskEntry]]]]]:
    """(identity, its entries, its classes) per task identity; a class is (title, the entries at one grid cell):
    what is compared within one table. Titles: "" without a grid, else "random depth", "depth 0.25", ..."""
    tables = []
    for identity in dict.fromkeys(entry.identity for entry in entries):
        members = [entry for entry in entries if entry.identity == identity]
        dimensions = {entry.cell[0] for entry in members if entry.cell}
        classes: dict[tuple | None, list[TaskEntry]] = {}
        for entry in members:
            classes.setdefault(entry.cell, []).append(entry)
        titled = [
            (f"{cell[0]} {cell[1]:g}" if cell else " or ".join(f"random {d}" for d in sorted(dimensions)), group)
            for cell, group in classes.items()
        ]
        tables.append((identity, members, titled))
    return tables


def task_measures(members: list[TaskEntry]) -> list[str]:
    rows = [row for entry in members for seed in entry.per_seed for row in seed.values()]
    return [measure for measure in TASK_MEASURES if any(row.get(measure) is not None for row in rows)]


def task_report(entries: list[TaskEntry], baseline: str | None = None) -> str:
    """Per task identity and measure: per grid cell, the table of mean ± CI over seeds by length, which settings'
    intervals are apart from the best's, and the paired differences against ``baseline`` (a setting's label,
    where the table has it) or else the best."""
    parts: list[str] = []
    for identity, members, classes in task_tables(entries):
        train_lens = {entry.train_len for entry in members}
        common_train_len = next(iter(train_lens)) if len(train_lens) == 1 else None
        if common_train_len is None:
            for entry in members:
                entry.label += f" (trained at {entry.train_len})"
        examples = sorted({row["n"] for entry in members for seed in entry.per_seed for row in seed.values()} - {0})
        n_text = f"{examples[0]}" if len(examples) == 1 else f"{examples[0]}-{examples[-1]}" if examples else "no"
        parts += ["", f"## Task: {identity}"]
        for measure in task_measures(members):
            values, estimate = task_values(measure), task_estimate(measure)
            parts += [
                "",
                f"{TASK_MEASURES[measure]} by evaluation length (eval/tasks.json; training length "
                f"{common_train_len or 'per row'}): mean over seeds ± half-width of the 95% confidence interval "
                "over seeds (Student t, n−1 degrees of freedom; one seed: the value alone; (n=k): only k seeds "
                f"have a value there). Each seed's value scores {n_text} held-out examples per cell (its own 95% "
                "Wilson interval is in its tasks.json). n/a: not evaluable there (tasks.json says why).",
            ]
            for title, members_at in classes:
                lengths = sorted({length for entry in members_at for seed in entry.per_seed for length in seed})
                header = length_header(lengths, common_train_len)
                parts += ["", f"{title}:"] if title else []
                parts += ["", table(members_at, lengths, header, estimate, digits=3, reading=ACCURACY)]
                if measure == "accuracy":
                    parts += effective_length_note(members_at)
                if len(members_at) < 2:  # nothing to compare with
                    continue
                if not any(len(entry.per_seed) > 1 for entry in members_at):
                    parts += ["", "One seed per setting: no intervals, so no difference is claimed."]
                    continue
                reference = next((entry for entry in members_at if entry.label == baseline), None)
                parts += [
                    "",
                    "Differences: a setting differs from the highest one at a length when their 95% intervals "
                    "do not overlap (a conservative rule).",
                    *differences(members_at, lengths, header, estimate, ACCURACY),
                    *paired_report(members_at, lengths, header, values, reference, ACCURACY),
                ]
    return "\n".join(parts).lstrip("\n") + "\n"


def effective_length_note(entries: list[TaskEntry]) -> list[str]:
    """The effective length of each setting's seeds (evaluation/tasks.py: the longest evaluated length up to which
    accuracy stays at or above the threshold at every length), where the entries have one (no grid cell)."""
    found = [entry for entry in entries if entry.effective]
    if not found:
        return []
    thresholds = sorted({threshold for entry in found for _, threshold in entry.effective})
    described = "; ".join(
        f"{entry.label}: {', '.join('-' if length is None else str(length) for length, _ in entry.effective)}"
        for entry in found
    )
    return [
        "",
        f"Effective length (the longest length up to which accuracy ≥ {' or '.join(map(str, thresholds))} at every "
        f"evaluated length; per seed, - where the shortest is below it): {described}.",
    ]


def task_csv(entries: list[TaskEntry], path: Path) -> Path:
    """One line per (identity, setting, grid cell, length, measure): the mean, its interval and every seed's value."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=TASK_CSV_COLUMNS)
    writer.writeheader()
    for entry in entries:
        task, _, settings = entry.identity.partition(" (")
        for measure in task_measures([entry]):
            values, estimate = task_values(measure), task_estimate(measure)
            for length in sorted({length for seed in entry.per_seed for length in seed}):
                value = estimate(entry, length)
                writer.writerow(
                    {
                        "task": task,
                        "task_settings": settings.removesuffix(")"),
                        "setting": entry.label,
                        **{key: (entry.cell[1] if entry.cell and entry.cell[0] == key else None) for key in GRIDS},
                        "length": length,
                        "multiple": round(length / entry.train_len, 4),
                        "measure": measure,
                        "seeds": 0 if value is None else value.n,
                        "mean": None if value is None else value.mean,
                        "half_width": None if value is None else value.half_width,
                        "ci_low": None if value is None or value.half_width is None else value.low,
                        "ci_high": None if value is None or value.half_width is None else value.high,
                        "values": json.dumps(values(entry, length)),
                    }
                )
    return atomic_write(path, text.getvalue())


def task_panels(entries: list[TaskEntry]) -> list[tuple[str, list[Series], set[int], str]]:
    """Per task identity, accuracy vs length with its CI band, one line per setting: at no grid cell (random
    depth), or, for a task measured only on a grid (the copy probe's distances), at its first cell; where the
    rows have a copy_gain (the copy probe's), a second panel of it, which says more than an accuracy of 0 does."""
    panels = []
    for identity, members, classes in task_tables(entries):
        title, cell_members = classes[0]
        for measure in [m for m in ("accuracy", "copy_gain") if m in task_measures(members)]:
            estimate = task_estimate(measure)
            series = []
            for entry in cell_members:
                points = [
                    (length, value)
                    for length in sorted({length for seed in entry.per_seed for length in seed})
                    if (value := estimate(entry, length)) is not None
                ]
                x, y, widths = [p[0] for p in points], [p[1].mean for p in points], [p[1].half_width for p in points]
                series.append(Series(entry.label, entry.scheme, x, y, widths))
            train_lens = {entry.train_len for entry in cell_members}
            panels.append((identity + (f", {title}" if title else ""), series, train_lens, measure))
    return panels


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


@exit_on_user_error
def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.stride is not None and args.protocol != "sliding":
        raise PosGPTError(f"--stride is the sliding protocol's; pass --protocol sliding or drop --stride {args.stride}")
    runs = load_runs(args.run_dirs)
    language_runs = [run for run in runs if run.document is not None]  # task runs have accuracy only
    tasks = task_entries(runs)
    # Checked before anything is written: only the outputs these runs have (a task study writes no perplexity plot)
    outputs = ["markdown", "val_curve", "entropy"]
    outputs += ["plot", "per_position"] if language_runs else []
    outputs += ["task_plot", "task_csv"] if tasks else []
    check_image_paths(
        {option_name(name): getattr(args, name) for name in outputs if name not in ("markdown", "task_csv")}
    )
    check_outputs({option_name(name): getattr(args, name) for name in outputs}, inputs=args.run_dirs)
    entries, report, written = [], "", []
    if language_runs:
        data = choose_data(language_runs, args.data)
        entries = entries_of(group_by_seed(language_runs), args.protocol, args.stride, data)
    check_requests(args, entries)
    if args.baseline is not None and not entries and args.baseline not in {entry.label for entry in tasks}:
        labels = ", ".join(repr(label) for label in dict.fromkeys(entry.label for entry in tasks))
        raise PosGPTError(f"--baseline {args.baseline!r} is not a setting of these runs; they are: {labels}")
    if entries:
        report = markdown_report(
            entries, args.protocol, args.stride, data, args.ratios, find_baseline(entries, args.baseline)
        )
    curves = validation_curves(group_by_seed(runs)) if args.val_curve is not None else []
    if curves:
        report += "\n" + validation_report(curves)
    if tasks:
        report += ("\n" if report else "") + task_report(tasks, args.baseline)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(report)
    print(report)
    written.append(args.markdown)
    if tasks:
        args.task_csv.parent.mkdir(parents=True, exist_ok=True)
        args.task_plot.parent.mkdir(parents=True, exist_ok=True)
        band = " (band: 95% CI over seeds)" if any(len(entry.per_seed) > 1 for entry in tasks) else ""
        plot_task_panels(task_panels(tasks), args.task_plot, f"Task results by evaluation length{band}")
        written += [task_csv(tasks, args.task_csv), args.task_plot]
    if entries:
        write_perplexity_plots(args, entries, data, written)
    if curves:
        args.val_curve.parent.mkdir(parents=True, exist_ok=True)
        band = " (band: 95% CI over seeds)" if max(curve.seeds for curve in curves) > 1 else ""
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
            f"Validation loss during training{band}",
        )
        written.append(args.val_curve)
    if args.entropy is not None:
        args.entropy.parent.mkdir(parents=True, exist_ok=True)
        plot_entropy_comparison(read_attention(args.run_dirs), args.entropy)
        written.append(args.entropy)
    print(f"compare: wrote {', '.join(map(str, written))}")


def write_perplexity_plots(args: argparse.Namespace, entries: list[Entry], data: str, written: list[Path]) -> None:
    """The perplexity plot and, with --per-position, the loss by position; each added to ``written``."""
    train_lens = {entry.train_len for entry in entries}
    seeds = sorted({len(entry.per_seed) for entry in entries})
    band = " (band: 95% CI over seeds)" if seeds[-1] > 1 else ""
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot_ppl_vs_length(
        ppl_series(entries), train_lens, args.plot, f"Length extrapolation ({args.protocol}, {data}){band}"
    )
    written.append(args.plot)
    if args.per_position is not None:
        length = longest_evaluated_length(entries)
        args.per_position.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            seed[length]
            for entry in entries
            for seed in entry.per_seed
            if length in seed and row_ppl(seed[length]) is not None
        ]
        plot_per_position(
            per_position_series(entries, length),
            train_lens,
            args.per_position,
            f"Loss by position in windows of {length} ({args.protocol}, {data}){band}\n{bins_note(rows)} per seed",
        )
        written.append(args.per_position)


if __name__ == "__main__":
    main(sys.argv[1:])
