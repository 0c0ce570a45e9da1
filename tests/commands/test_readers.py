"""Who reads each setting, as the schema declares it (core.domain: ``commands`` and ``runs``, on a field or on its
section, and ``used_with``), held against what the commands refuse: for every setting, every command (train.py,
eval.py, sample.py, scripts/inspect_attention.py) and every kind of run (text, a task), the setting is either read
there or, given a valid value other than its default, refused in one line that names it.

The walk runs the checks each command runs, in this process, on configs composed once: train.py's plan
(experiment.plan.plan_training, the model on the meta device), and an evaluation's (experiment.settings'
check_changeable on the trained config, then experiment.config.validate with the override applied), as
experiment.build.load_trained_run runs them. sample.py and inspect_attention.py take text runs only (a task run is
refused whatever it is given, experiment.build.require_text_run): their task cases are that one refusal, not
walked. Beside a plain run of each kind, the runs a study trains are walked as their checkpoints record them (Run):
one that stores eval-time variations (a stored command setting gives way to one given: given_wins, never a reason
to refuse), a hybrid, a fine-tuned run (train.py's plan reads a real tiny parent), and train.py with its
end-of-training evaluation, into which every eval.* setting it reads is planned. A few cases go through the real
commands, and leave the run directory byte for byte as it was.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import io
import re
import sys
import typing
from pathlib import Path

import pytest
from cli_runs import TINY, assert_one_line_error
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from core.domain import Leaf, as_typed, domain_of, leaves, used_with
from core.errors import PosGPTError
from data.tasks import TASKS
from experiment.compose import NEW_RUN_DIR, compose_config
from experiment.config import set_task_vocabulary, validate
from experiment.eval_checks import check_eval_settings
from experiment.plan import plan_training
from experiment.settings import check_changeable, given_wins
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
    "pe.scaling.type": "yarn",
    "model.attn_backend": "sdpa",
    "model.embedding": "gpt2",
    "model.fused_ce": "never",
    "model.flex_kernel_options": {"BLOCK_M": 32},
}


@dataclasses.dataclass(frozen=True)
class Run:
    """A kind of run walked: its task (``text``: none), its scheme, and what its config records beside them
    (``stored``: the overrides it was trained with, as a checkpoint keeps them); ``commands``: the commands walked
    on it (None: every command that takes a run of its task)."""

    task: str = "text"
    pe: str = "rope"
    stored: tuple[str, ...] = ()
    commands: tuple[str, ...] | None = None
    name: str = ""  # how a case names it (its stored settings, where not given)

    @property
    def kind(self) -> str:
        return "text" if self.task == "text" else "task"

    def walked(self) -> tuple[str, ...]:
        takes = tuple(COMMANDS) if self.task == "text" else TASK_COMMANDS
        return tuple(command for command in takes if self.commands is None or command in self.commands)

    def plain(self) -> Run:
        """The same run without what it stores: its task and scheme at their defaults."""
        return Run(self.task, self.pe, (), self.commands)

    def __str__(self) -> str:
        return ":".join([self.task, f"pe={self.pe}", *([self.name] if self.name else self.stored)])


@functools.cache
def trained(run: Run) -> typing.Any:
    """The config of ``run`` as its checkpoint records it."""
    task = [] if run.task == "text" else [f"task={run.task}"]
    cfg = compose_config([f"pe={run.pe}", *task, *run.stored])
    set_task_vocabulary(cfg)
    return cfg


def is_read(leaf: Leaf, command: str, kind: str, config: typing.Any) -> bool:
    """Whether the schema declares that ``command`` reads the setting in a run of ``kind`` (``text`` or ``task``)
    with the other settings of ``config``: its commands, its kinds of run, and its selector's value (or a type that
    eval.variations names: a scheme configured without an extension holds the settings its variations read)."""
    if command not in leaf.readers.commands or (leaf.readers.runs is not None and kind not in leaf.readers.runs):
        return False
    owner = used_with(leaf.field)
    if owner is None:
        return True
    parent = functools.reduce(getattr, leaf.key.split(".")[:-1], config)
    chosen = getattr(parent, owner[0])
    variations = {re.split(r"[:.]", spec)[0] for spec in config.eval.variations or ()}
    return bool((set(chosen if isinstance(chosen, list) else [chosen]) | variations) & set(owner[1]))


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
    """A setting given to a command in a run of a kind."""

    command: str
    run: Run
    key: str
    value: typing.Any
    command_reads: bool = False  # the command reads the setting in some runs (the kind or a selector rules it out)

    def __str__(self) -> str:
        return f"{COMMANDS[self.command]}:{self.run}:{self.key}={as_typed(self.value)}"


def planned(case: Case) -> typing.Any:
    """What the command's checks make of the case's run given its setting: train.py's plan (the stored settings
    given on its command line, as scripts/study.sh gives them), or the config an evaluation runs with
    (experiment.build.load_trained_run's checks: the stored command settings give way to the user's, given_wins);
    PosGPTError where they refuse it."""
    command, key, value = case.command, case.key, case.value
    cfg = copy.deepcopy(trained(case.run))
    if command == "train":
        OmegaConf.update(cfg, key, value, merge=False)
        return plan_training(cfg, [*case.run.stored, f"{key}={as_typed(value)}"], NEW_RUN_DIR)
    script = COMMANDS[command]
    check_changeable(cfg, [key], script)
    OmegaConf.update(cfg, key, value, merge=False)

    def check(candidate: typing.Any) -> None:
        validate(candidate, keys=[key], command=script)
        if script == "eval.py":
            check_eval_settings(candidate)

    if not case.run.stored:  # nothing stored to give way: given_wins is the check (run once, not twice)
        check(cfg)
        return cfg
    return given_wins(cfg, [key], check, script)


def refusal(case: Case) -> str | None:
    """What the command's checks say of the case's run given its setting (None: accepted)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # given_wins says what it drops
            planned(case)
    except PosGPTError as error:
        return str(error)
    return None


def walk(runs: typing.Iterable[Run], under: str = "") -> tuple[list[Case], list[Case]]:
    """The settings (those under ``under``: all for "") of each run, one case each per command walked on it: those
    the schema declares unread, and those it declares read."""
    unread, read = [], []
    for run in runs:
        config = OmegaConf.to_object(trained(run))
        for leaf in leaves(config):
            for command in run.walked() if leaf.key.startswith(under) else ():
                case = Case(command, run, leaf.key, another_value(leaf), command in leaf.readers.commands)
                (read if is_read(leaf, command, run.kind, config) else unread).append(case)
    return unread, read


def unread_cases(tasks: typing.Iterable[str], pe: str = "rope", under: str = "") -> tuple[list[Case], int]:
    """The settings (those under ``under``: all for "") that the schema declares unread, one case each per command
    and kind of run (a task's name, or text), and how many (setting, command, kind) it declares read."""
    unread, read = walk([Run(task, pe) for task in tasks], under)
    return unread, len(read)


def refused_unread(cases: list[Case]) -> list[str]:
    """The cases not refused as unread in one line, each with what its command said."""
    wrong = []
    for case in cases:
        said = refusal(case)
        phrases = (*UNREAD, THE_RUNS) if case.command_reads and case.command != "train" else UNREAD
        if said is None or case.key not in said or not any(p in said for p in phrases) or "\n" in said:
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


# The kinds of run a study trains, beside a plain one: each walked as its checkpoint records it.
RUN_READERS = ("eval", "sample", "inspect")  # the commands that read a trained run
STORED_VARIATIONS = Run(stored=("eval.variations=[none,yarn:2]",))  # as scripts/study.sh trains every RoPE run
# a fine-tuned run records its parent (train.init_from) and what became of the parent's scheme; the run-reading
# commands never open the parent (train.py's plan does: test_a_fine_tuned_run_...)
FINE_TUNED = [
    Run(stored=("train.init_from=/runs/parent", f"train.init_from_pe={how}"), commands=RUN_READERS)
    for how in ("keep", "replace")
]
STORED_RUNS = [STORED_VARIATIONS, Run(pe="hybrid"), Run("passkey", "hybrid"), *FINE_TUNED]


def given_refused_for_stored(cases: list[Case]) -> list[str]:
    """The cases that a run-reading command accepts in the run without what it stores, yet refuses in the run:
    a stored value that is the reason for a refusal of the setting the user gives."""
    wrong = []
    for case in cases:
        if case.command != "train" and refusal(dataclasses.replace(case, run=case.run.plain())) is None:
            said = refusal(case)
            wrong += [f"{case}: {said}"] if said is not None else []
    return wrong


@pytest.mark.slow
@pytest.mark.parametrize("run", STORED_RUNS, ids=str)
def test_every_setting_is_read_or_refused_in_a_run_as_a_study_trains_it(run):
    """A run that stores eval-time variations, a hybrid (its default pattern) and a fine-tuned run: every setting,
    every command that takes the run, is read there or refused in one line naming it."""
    unread, read = walk([run])
    assert len(unread) > 100 and len(read) > 100, (len(unread), len(read))  # the walk saw the schema
    assert not refused_unread(unread), "\n".join(refused_unread(unread))


@pytest.mark.slow
@pytest.mark.parametrize("run", [STORED_VARIATIONS, *FINE_TUNED], ids=str)
def test_a_stored_value_is_never_the_reason_to_refuse_a_setting_given(run):
    """Each setting a run-reading command reads, given a value it accepts in the run without what it stores, is
    accepted in the run (experiment.settings.given_wins: a stored eval.variations gives way to a scaling given)."""
    _, read = walk([run])
    assert sum(case.command != "train" for case in read) > 100
    assert not given_refused_for_stored(read), "\n".join(given_refused_for_stored(read))


@pytest.fixture(scope="module")
def fine_tuned(cli, tmp_path_factory) -> Run:
    """A run fine-tuned from a real tiny parent on disk (RoPE, TINY's architecture): train.py's plan reads it."""
    parent = make_run(tmp_path_factory.mktemp("readers-parent") / "run", cli.corpus, "pe=rope")
    tiny = [arg for arg in TINY if not arg.startswith(("pe=", "train.eval_after"))]  # an evaluation after it
    stored = (*tiny, f"data.files=[{cli.corpus}]", f"train.init_from={parent}")
    return Run(stored=stored, name="init_from=parent")


@pytest.mark.slow
def test_every_setting_is_read_or_refused_in_a_fine_tuned_run_by_every_command(fine_tuned):
    unread, read = walk([fine_tuned])
    assert sum(case.command == "train" for case in unread) > 20, len(unread)
    assert not refused_unread(unread), "\n".join(refused_unread(unread))
    assert planned(dataclasses.replace(read[0], command="train", key="train.lr", value=1e-3)).parent is not None


def nested(settings: dict, key: str) -> typing.Any:
    return functools.reduce(lambda node, name: node[name], key.split("."), settings)


END_OF_TRAINING = [Run(task, stored=("train.eval_after=true",), commands=("train",)) for task in ("text", "passkey")]


@pytest.mark.parametrize("run", END_OF_TRAINING, ids=str)
def test_train_reads_every_evaluation_setting_into_the_evaluation_after_training(run):
    """train.eval_after=true (its default, given as a study gives it): train.py plans the end-of-training evaluation
    (experiment.plan.plan_end_of_training), so that every eval.* setting the schema declares it reads, given a
    valid value other than its default, is either refused in one line naming it or planned into that evaluation;
    those it does not read are refused as unread."""
    unread, read = walk([run], under="eval.")
    assert len(read) > 5, len(read)
    wrong = refused_unread(unread)
    for case in read:
        try:
            plan = planned(case)
        except PosGPTError as error:
            wrong += [f"{case}: {error}"] if case.key not in str(error) or "\n" in str(error) else []
            continue
        if plan.evaluation is None or nested(plan.evaluation.settings, case.key[len("eval.") :]) != case.value:
            wrong.append(f"{case}: not planned into the evaluation after training")
    assert not wrong, "\n".join(wrong)


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
            "eval.py does not read train.compile (read by train.py and scripts/speed.py)",
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
