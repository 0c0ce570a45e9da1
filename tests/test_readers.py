"""Who reads each setting, as the schema declares it (core.domain: ``commands`` and ``runs``, on a field or on its
section, and ``used_with``), held against what the commands refuse: for every setting, every command (train.py,
eval.py, sample.py, scripts/inspect_attention.py) and every kind of run (text, a task), the setting is either read
there or, given a valid value other than its default, refused in one line that names it.

The walk runs the checks each command runs, in this process, on configs composed once: train.py's plan
(experiment.plan.plan_training, the model on the meta device), and an evaluation's (experiment.settings'
check_changeable on the trained config, then experiment.config.validate with the override applied), as
experiment.build.load_trained_run runs them. sample.py and inspect_attention.py take text runs only (a task run is
refused whatever it is given, experiment.build.require_text_run): their task cases are that one refusal, not
walked. A few cases go through the real commands, and leave the run directory byte for byte as it was.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import sys
import typing
from pathlib import Path

import pytest
from cli_runs import assert_one_line_error
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from core.domain import Leaf, as_typed, domain_of, leaves, used_with
from core.errors import PosGPTError
from data.tasks import TASKS
from experiment.compose import NEW_RUN_DIR, compose_config
from experiment.config import set_task_vocabulary, validate
from experiment.plan import plan_training
from experiment.settings import check_changeable
from model.pe import SCHEMES

# what reads a training setting: train.py, and the benchmarks that time and size a training step
TRAINING_READERS = "(read by train.py, scripts/speed.py and scripts/estimate.py)"

COMMANDS = {"train": "train.py", "eval": "eval.py", "sample": "sample.py", "inspect": "scripts/inspect_attention.py"}
TASK_COMMANDS = ("train", "eval")  # sample.py and scripts/inspect_attention.py refuse a task run, whatever it is given
# What a refusal of a setting that nothing reads says (core.domain, experiment/config.py); and what an evaluation
# says of a setting that its command reads in some runs but may not change (experiment/settings.py): the run's.
UNREAD = ("does not read", "is read only", "ignores it")
THE_RUNS = "cannot be changed for an evaluation"
# Valid values of settings whose type does not say them (the checks refuse another string): what each case gives.
VALUES = {
    "train.device": "cpu",
    "train.dtype": "float32",
    "train.compile": "false",
    "train.distributed": "fsdp",
    "logging.wandb.mode": "online",
    "data.source": "hub",
    "data.eval_split": "val",
    "eval.protocols": ["sliding"],
    "eval.tasks": ["copy_probe"],
    "eval.variations": ["yarn:2"],
    "model.attn_backend": "sdpa",
    "model.embedding": "gpt2",
    "model.fused_ce": "never",
    "model.flex_kernel_options": {"BLOCK_M": 32},
}


@functools.cache
def trained(kind: str, pe: str = "rope") -> typing.Any:
    """The default config of a run of ``kind`` (``text``, or a task's name) and scheme ``pe``, as a checkpoint
    records it."""
    cfg = compose_config([f"pe={pe}"] if kind == "text" else [f"pe={pe}", f"task={kind}"])
    set_task_vocabulary(cfg)
    return cfg


def is_read(leaf: Leaf, command: str, kind: str, config: typing.Any) -> bool:
    """Whether the schema declares that ``command`` reads the setting in a run of ``kind`` (a task's name counts
    as ``task``) with the other settings of ``config``: its commands, its kinds of run, and its selector's value."""
    run = "text" if kind == "text" else "task"
    if command not in leaf.readers.commands or (leaf.readers.runs is not None and run not in leaf.readers.runs):
        return False
    owner = used_with(leaf.field)
    if owner is None:
        return True
    parent = functools.reduce(getattr, leaf.key.split(".")[:-1], config)
    chosen = getattr(parent, owner[0])
    return bool(set(chosen if isinstance(chosen, list) else [chosen]) & set(owner[1]))


def another_value(leaf: Leaf) -> typing.Any:
    """A value of the setting that its domain and its type accept, and that is not its default."""
    if leaf.key in VALUES:
        return VALUES[leaf.key]
    if isinstance(leaf.value, bool):
        return not leaf.value
    is_list = isinstance(leaf.value, list) or "list" in str(leaf.field.type)
    interval = domain_of(leaf.field)
    if interval is not None:
        start = leaf.value[0] if isinstance(leaf.value, list) and leaf.value else leaf.value
        numbers = [start * 2, start + 1, start / 2] if isinstance(start, (int, float)) else []
        numbers += [bound + step for bound in (interval.ge, interval.gt) if bound is not None for step in (0, 1, 0.5)]
        number = next(n for n in [*numbers, 1, 0.5, -1] if n in interval and n != start)
        number = int(number) if int(number) == number else number
        return [number] if is_list else number
    return ["other"] if is_list else "other"


@dataclasses.dataclass(frozen=True)
class Case:
    """A setting given to a command in a run of a kind and a scheme."""

    command: str
    kind: str
    key: str
    value: typing.Any
    pe: str = "rope"
    command_reads: bool = False  # the command reads the setting in some runs (the kind or a selector rules it out)

    def __str__(self) -> str:
        return f"{COMMANDS[self.command]}:{self.kind}:pe={self.pe}:{self.key}={as_typed(self.value)}"


def refusal(case: Case) -> str | None:
    """What the command's checks say of the case's run given its setting (None: accepted)."""
    command, key, value = case.command, case.key, case.value
    cfg = copy.deepcopy(trained(case.kind, case.pe))
    try:
        if command == "train":
            OmegaConf.update(cfg, key, value, merge=False)
            plan_training(cfg, [f"{key}={as_typed(value)}"], NEW_RUN_DIR)
        else:
            check_changeable(cfg, [key], COMMANDS[command])
            OmegaConf.update(cfg, key, value, merge=False)
            validate(cfg, keys=[key], command=COMMANDS[command])
    except PosGPTError as error:
        return str(error)
    return None


def unread_cases(kinds: typing.Iterable[str], pe: str = "rope", under: str = "") -> tuple[list[Case], int]:
    """The settings (those under ``under``: all for "") that the schema declares unread, one case each per command
    and kind of run, and how many (setting, command, kind) it declares read."""
    found, read = [], 0
    for kind in kinds:
        config = OmegaConf.to_object(trained(kind, pe))
        for leaf in leaves(config):
            for command in (COMMANDS if kind == "text" else TASK_COMMANDS) if leaf.key.startswith(under) else ():
                if is_read(leaf, command, kind, config):
                    read += 1
                else:
                    found.append(
                        Case(command, kind, leaf.key, another_value(leaf), pe, command in leaf.readers.commands)
                    )
    return found, read


def refused_unread(cases: list[Case]) -> list[str]:
    """The cases not refused as unread, each with what its command said."""
    wrong = []
    for case in cases:
        said = refusal(case)
        phrases = (*UNREAD, THE_RUNS) if case.command_reads and case.command != "train" else UNREAD
        if said is None or case.key not in said or not any(phrase in said for phrase in phrases):
            wrong.append(f"{case}: {said or 'accepted'}")
    return wrong


def test_every_setting_is_read_or_refused_by_every_command_in_every_kind_of_run():
    """Language modelling and passkey (a task whose keys have a depth), every setting, every command."""
    cases, read = unread_cases(["text", "passkey"])
    assert read > 200 and len(cases) > 150, (read, len(cases))  # the walk saw the schema
    assert not refused_unread(cases), "\n".join(refused_unread(cases))


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(set(TASKS) - {"passkey"}))
def test_every_setting_is_read_or_refused_in_a_run_of_every_task(task):
    """The task's own settings and the evaluation's (its grid: a depth only where the task has one); the rest is
    as for passkey."""
    cases = [case for under in ("task.", "eval.") for case in unread_cases([task], under=under)[0]]
    assert not refused_unread(cases), "\n".join(refused_unread(cases))


def setting_names(config_class: type, prefix: str = "") -> frozenset[str]:
    """Every dotted setting a scheme's config holds, its nested sections' too."""
    names = set()
    for field in dataclasses.fields(config_class):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        nested = dataclasses.is_dataclass(default)
        names |= setting_names(type(default), f"{prefix}{field.name}.") if nested else {prefix + field.name}
    return frozenset(names)


def one_scheme_per_setting_layout() -> list[str]:
    """The schemes to walk: of those that hold the same settings (the per-layer presets hold the per-layer scheme's,
    read by the same rules about their pattern), the first by name; RoPE is walked by the fast test."""
    walked: dict[frozenset[str], str] = {}
    for name in sorted(set(SCHEMES) - {"rope"}):
        walked.setdefault(setting_names(SCHEMES[name].config_class), name)
    return sorted(walked.values())


@pytest.mark.slow
@pytest.mark.parametrize("pe", one_scheme_per_setting_layout())
def test_every_setting_of_every_scheme_is_read_or_refused(pe):
    cases, read = unread_cases(["text", "passkey"], pe=pe, under="pe.")
    assert read, f"no setting of pe={pe} walked"
    assert not refused_unread(cases), "\n".join(refused_unread(cases))


def test_a_setting_of_another_task_or_scheme_names_what_reads_it(cli, tmp_path):
    run_dir = tmp_path / "run"
    done = cli.train_here(run_dir, "task=passkey", "task.n_pairs=3")
    assert_one_line_error(done, "task.n_pairs", "not in 'PasskeyConfig'", "task.n_pairs is read by task=mqar")
    done = cli.train_here(run_dir, "pe=alibi", "pe.scaling.factor=2")
    assert_one_line_error(done, "pe.scaling.factor is read by pe=rope, pe=p_rope")
    assert not run_dir.exists()


# --- through the real commands --------------------------------------------------------------------------------


def tree_digest(run_dir: Path) -> str:
    """Every file's path and bytes under ``run_dir``: equal digests, the same tree byte for byte."""
    digest = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        digest.update(str(path.relative_to(run_dir)).encode())
        digest.update(path.read_bytes() if path.is_file() else b"/")
    return digest.hexdigest()


@pytest.fixture(scope="module")
def text_run(cli, tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("readers") / "run", cli.corpus)


@pytest.fixture(scope="module")
def task_run(cli, tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("readers-task") / "run", cli.corpus, "task=passkey", "train.seq_len=32")


@pytest.mark.parametrize(
    ("script", "run", "override", "line"),
    [
        (
            "sample.py",
            "text",
            "train.lr=3e-4",
            f"sample.py does not read train.lr {TRAINING_READERS}",
        ),
        ("sample.py", "text", "data.val_fraction=0.5", "sample.py does not read data.val_fraction (read by train.py,"),
        ("sample.py", "text", "logging.wandb.mode=online", "sample.py does not read logging.wandb.mode"),
        ("sample.py", "text", "model.fused_ce=never", "sample.py does not read model.fused_ce"),
        (
            "eval.py",
            "text",
            "train.compile=false",
            f"eval.py does not read train.compile {TRAINING_READERS}",
        ),
        (
            "eval.py",
            "text",
            "model.dropout=0.1",
            f"eval.py does not read model.dropout {TRAINING_READERS}",
        ),
        ("eval.py", "task", "data.val_fraction=0.5", "data.val_fraction=0.5 is read only by a language-model run"),
        (
            "eval.py",
            "task",
            "task.n_pairs=3",
            "task.n_pairs is not a setting of this run (task=passkey): it is read by",
        ),
        ("scripts/inspect_attention.py", "text", "sample.top_k=5", "scripts/inspect_attention.py does not read sample"),
    ],
)
def test_a_command_refuses_what_it_does_not_read_and_leaves_the_run_as_it_was(
    cli, text_run, task_run, script, run, override, line
):
    run_dir = text_run if run == "text" else task_run
    before = tree_digest(run_dir)
    done = cli.here(script, f"run_dir={run_dir}", override)
    assert_one_line_error(done, line)
    assert tree_digest(run_dir) == before


def test_train_refuses_the_corpus_of_a_task_run_before_writing(cli, tmp_path):
    run_dir = tmp_path / "run"
    done = cli.here("train.py", "task=passkey", "data.val_fraction=0.5", f"hydra.run.dir={run_dir}")
    assert_one_line_error(done, "data.val_fraction=0.5 is read only by a language-model run", "task=passkey")
    assert not run_dir.exists()


@pytest.mark.slow  # a process of its own: the in-process runs above answer as it does
def test_the_command_line_refuses_what_it_does_not_read(cli, text_run):
    before = tree_digest(text_run)
    done = cli.run([sys.executable, "sample.py", f"run_dir={text_run}", "train.lr=3e-4"])
    assert_one_line_error(done, f"sample.py does not read train.lr {TRAINING_READERS}")
    assert tree_digest(text_run) == before
