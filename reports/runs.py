"""The runs a comparison reads, and which of them are seeds of one setting.

A run's results are its eval/extrapolation.json (perplexity) and eval/tasks.json (a task run's accuracy, or a
language-model run's copy probe); its config is the one it was trained with, read from its checkpoint, or, for
results copied without checkpoints (results/), from the config its results record (run_config). Runs whose
configs differ only in ``train.seed`` and in what does not change the trained model (NOT_A_SETTING), and whose
results scored checkpoints of one step, are seeds of one setting (group_by_seed), labelled by what tells them
from the other settings of their scheme (group_labels). An Entry is a table row: one setting's rows pooled over
its seeds.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.checkpoint_io import last_checkpoint_path, load_checkpoint
from core.config_keys import RESUME_SETTINGS, flatten_config, may_change
from core.errors import PosGPTError
from core.files import read_jsonl
from core.rundir import METRICS_FILE
from core.text import printable
from evaluation.perplexity_format import load_results
from evaluation.results import condition_label
from evaluation.run import EVAL_DIR, load_run_results
from evaluation.schemes import display_name
from evaluation.task_accuracy import load_task_results as load_tasks_document
from model.temperature import temperature_settings

# Config keys that do not make two runs different settings: the seed, and what a resumed run may change
# (logging, evaluation, threads, ...) except what changes the trained model (its length, its precision).
NOT_A_SETTING = ("train.seed",) + tuple(key for key in RESUME_SETTINGS if key not in ("train.max_steps", "train.dtype"))


# A saved config typed by today's schema (experiment/settings.py's trained_config, handed in by the command).
TypeConfig = Callable[[dict[str, Any]], DictConfig]


def run_config(run_dir: Path, document: dict[str, Any], typed_by: TypeConfig) -> tuple[dict[str, Any], int | None]:
    """The resolved config of the checkpoint whose results ``document`` holds, and the step of the run's last
    checkpoint (None without checkpoints). The document records the config of the checkpoint that scored it
    (evaluation/run.py): a run resumed since with other settings has a last checkpoint that did not score these
    rows, so its config would label them with settings they were not scored with. Only a document whose config is
    null (one that never recorded it: evaluation/migrate.py) is read through the checkpoint, which must then be the
    one that scored it. compare reads configs only here.

    The config is typed by today's schema (``typed_by``), so that a setting added since a run was trained (absent
    from its config) reads as its default and does not set that run apart from newer ones."""
    checkpoint = load_checkpoint(run_dir) if last_checkpoint_path(run_dir).is_file() else None
    latest = None if checkpoint is None else checkpoint["step"]
    if document.get("config") is not None:
        return typed_config(document["config"], typed_by), latest
    if checkpoint is None:
        raise PosGPTError(
            f"{run_dir} has no checkpoint, and its {EVAL_DIR}/extrapolation.json records no trained config, so it "
            "does not say how the run was trained"
        )
    if latest != document["step"]:
        raise PosGPTError(
            f"{run_dir}: its results scored the checkpoint of step {document['step']} and record no config; its last "
            f"checkpoint is of step {latest}: evaluate it again (python eval.py run_dir={run_dir})"
        )
    return typed_config(checkpoint["config"], typed_by), latest


_TYPED: dict[str, dict[str, Any]] = {}


def typed_config(saved: dict[str, Any], typed_by: TypeConfig) -> dict[str, Any]:
    """typed_by(saved) as a plain resolved dict. Typing a config by the schema is most of a
    comparison's time, and the seeds of one setting differ only in ``train.seed``: they share one typing (keyed by
    the config less its seed, and whether it has one), the seed put back. A config with an interpolation left in
    it, or a seed that is not an int, is typed on its own."""
    train = dict(saved.get("train") or {})
    has_seed, seed = "seed" in train, train.pop("seed", None)
    key = json.dumps([has_seed, {**saved, "train": train}], sort_keys=True, default=repr)
    if "${" in key or (has_seed and type(seed) is not int):
        return OmegaConf.to_container(typed_by(saved), resolve=True)
    if key not in _TYPED:
        _TYPED[key] = OmegaConf.to_container(typed_by(saved), resolve=True)
    typed = copy.deepcopy(_TYPED[key])
    if has_seed:
        typed["train"]["seed"] = seed
    return typed


@dataclass
class Run:
    """A training run: its eval/extrapolation.json (None for a task run, which has none), its trained config, and
    its eval/tasks.json where it has one (a task run's accuracy, or a language-model run's copy probe)."""

    dir: Path
    document: dict[str, Any] | None
    config: dict[str, Any]
    tasks: dict[str, Any] | None = None
    latest_step: int | None = None  # the step of its last checkpoint (None: none kept, as in results/)
    parent: dict[str, Any] | None = None  # a fine-tuned run's parent, as its setting reads it (parent_identity)

    @property
    def pe(self) -> str:
        return (self.document or self.tasks)["pe"]

    @property
    def step(self) -> int:
        """The training step of the checkpoint its results scored."""
        return (self.document or self.tasks)["step"]

    @property
    def superseded(self) -> bool:
        """Whether its results scored an earlier checkpoint than its last (trained on since, not evaluated again)."""
        return self.latest_step is not None and self.step != self.latest_step


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


# The measures a task row may hold (evaluation/task_accuracy.py), with what they are: reports/task_tables.py makes a
# table of each one some row has.
TASK_MEASURES = {
    "accuracy": "Exact-match accuracy",
    "mean_logprob": "Mean log-probability of the answer tokens (nats)",  # the copy probe's
    "copy_gain": "What the first copy adds to the repeat's mean log-probability (nats; 0: not used)",  # likewise
}


def load_task_results(run_dir: Path) -> dict[str, Any] | None:
    """A run's eval/tasks.json, or None where it has none; a damaged or malformed one is a PosGPTError naming it."""
    return load_tasks_document(Path(run_dir) / EVAL_DIR)


def load_runs(run_dirs: list[Path], typed_by: TypeConfig) -> list[Run]:
    """Each run's results: extrapolation.json, and tasks.json where there is one (a task run has only that); its
    config typed by ``typed_by`` (run_config)."""
    runs = []
    for run_dir in run_dirs:
        tasks = load_task_results(run_dir)
        document = load_run_results(run_dir) if tasks is None else load_results(Path(run_dir) / EVAL_DIR)
        if document is not None and tasks is not None and document["step"] != tasks["step"]:
            raise PosGPTError(
                f"{run_dir}: its perplexity scored the checkpoint of step {document['step']}, its tasks.json that "
                f"of step {tasks['step']}: evaluate it again (python eval.py run_dir={run_dir} ...)"
            )
        config, latest = run_config(run_dir, document or tasks, typed_by)
        runs.append(Run(run_dir, document, config, tasks, latest, parent_identity(run_dir, config, typed_by)))
    return runs


def parent_identity(run_dir: Path, config: dict[str, Any], typed_by: TypeConfig) -> dict[str, Any] | None:
    """What a fine-tuned run (train.init_from) was started from, so that the seeds of one fine-tuning, each from its
    own parent's directory, are one setting: the parent's setting (its config less what does not make a setting,
    the seed included) where its results can be read at the recorded path, else what the run recorded of it when it
    started (metrics.jsonl: the parent's scheme, training length and step; exports keep that record). None for a
    run trained from scratch; the path itself where neither is known."""
    path = (config.get("train") or {}).get("init_from")
    if path is None:
        return None
    parent_dir, document = Path(path), None
    if parent_dir.is_dir():
        with contextlib.suppress(PosGPTError):  # a parent's damaged results: what the run recorded of it instead
            document = load_task_results(parent_dir) or load_results(parent_dir / EVAL_DIR)
    if document is not None and document.get("config") is not None:
        return {"setting": setting_of(typed_config(document["config"], typed_by), document["step"])}
    started = next((r for r in read_jsonl(Path(run_dir) / METRICS_FILE) or [] if "init_from" in r), None)
    if started is None:
        return {"path": path}
    return {key: started.get(key) for key in ("parent_pe", "parent_seq_len", "parent_step")}


def evaluated_with(row: dict[str, Any], run: Run) -> str:
    """What a row was evaluated with besides the run as trained, for a table row's label: evaluation/results.py's
    condition_label without the attention temperature the run was trained with (a run trained with SSMax reads
    as trained, not "ssmax": its setting's label names it already)."""
    trained = run.config.get("model", {}).get("attn_temperature")  # every run_config has it; hand-made runs may not
    if trained is not None and row.get("attn_temperature") == temperature_settings(trained):
        row = {**row, "attn_temperature": None}
    return condition_label(row)


def setting(run: Run) -> dict[str, str]:
    """The flattened config without the keys that do not make a different setting (NOT_A_SETTING), and the step
    scored: checkpoints of one run at other steps (eval.py on a copy of step_N.pt) are other models. A fine-tuned
    run's parent is its parent's identity (parent_identity), not the path of its directory."""
    kept = setting_of(run.config, run.step)
    if run.parent is not None and "train.init_from" in kept:
        kept["train.init_from"] = json.dumps(run.parent, sort_keys=True)
    return kept


def setting_of(config: dict[str, Any], step: int) -> dict[str, str]:
    """A resolved config's keys that make a setting, as JSON text, and the step of the checkpoint scored."""
    kept = {
        key: json.dumps(value, sort_keys=True)
        for key, value in flatten_config(config).items()
        if not may_change(key, NOT_A_SETTING)
    }
    return {**kept, "step": json.dumps(step)}


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
    return [
        " ".join([display_name(group[0].pe)] + detail + superseded(group)) for group, detail in zip(groups, details)
    ]


def superseded(group: list[Run]) -> list[str]:
    """A label's note where the group's results scored an earlier checkpoint than its runs' last: those rows are
    not the runs as they are now."""
    latest = sorted({run.latest_step for run in group if run.superseded})
    if not latest:
        return []
    return [f"[step {group[0].step}, not the last: {', '.join(map(str, latest))}]"]


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
    return [printable(name) for name in names]  # a label is one line in every sink (core.text)
