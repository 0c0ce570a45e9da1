"""Every numeric setting declares its domain in the schema (core/domain.py), and every command refuses a value
outside it at start-up: one line, ``error: <key>=<value> is out of its domain <interval>``, exit code 2.

The keys are enumerated from the schema itself, so a key added later is walked too, and one without a declared
domain fails test_every_numeric_key_declares_a_domain. Every key and bound is walked through the check itself
(experiment.config.validate on the composed config, ~0.1 s a case), and a sample of cases (every command's first
and every eighth, ~80) through each command's real entry point in this process (``runpy``, as ``python <script>``
runs it, with the real argv; ~0.5 s of Hydra composition a case), where the answer must equal the check's. A few
real subprocesses (slow) show that the in-process run answers as the command line does.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import re
import runpy
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import fuzz_cli
import pytest
import torch
from cli_runs import REPO, Runner, assert_one_line_error
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tiny_checkpoint import make_run

from core.config_keys import may_change
from core.domain import COMMANDS as DECLARED_COMMANDS
from core.domain import Interval, check_domains, choices_of, domain, is_nonempty, leaves, readers_of
from core.errors import PosGPTError
from data.tasks import NO_TASK, TASKS
from experiment.compose import CONFIG_DIR, compose_config
from experiment.config import register_configs, schema, validate
from experiment.settings import eval_settings
from model.pe import SCHEMES

# The commands that compose a config, and whether they read a trained run (run_dir=...).
COMMANDS = {
    "train.py": False,
    "scripts/speed.py": False,
    "eval.py": True,
    "sample.py": True,
    "scripts/inspect_attention.py": True,
}
RUN_PE = "rope"  # the scheme of the run the run-reading commands get: its pe.scaling may change at evaluation


# --- the schema's numeric keys ------------------------------------------------------------------------------


NumericKey = fuzz_cli.Key  # the fuzzer's walk of the schema (tests/support/fuzz_cli.py): one walk for both


def numeric_keys(config: typing.Any) -> Iterator[NumericKey]:
    """The int and float keys (and lists of them) of a config dataclass instance, nested ones included."""
    return (key for key in fuzz_cli.schema_keys(config) if key.kind in (int, float))


@functools.cache
def schema_keys(pe: str) -> list[NumericKey]:
    return list(numeric_keys(schema_object(pe)))


def outside(key: NumericKey) -> list[int | float]:
    """A value just past each bound of the key's domain (none without a domain: the test below fails then)."""
    interval = key.interval
    if interval is None:
        return []
    values = [
        bound
        for bound in (
            None if interval.ge is None else interval.ge - 1,
            interval.gt,
            None if interval.le is None else interval.le + 1,
            interval.lt,
        )
        if bound is not None
    ]
    if not values and key.kind is float:
        values = [float("inf")]
    return [key.kind(value) for value in values]


def test_every_numeric_key_declares_a_domain():
    for pe in SCHEMES:
        undeclared = [k.key for k in schema_keys(pe) if k.interval is None or not outside(k)]
        assert not undeclared, f"declare a domain (core/domain.py) for {undeclared} (pe={pe})"
    for task in TASKS:
        keys = numeric_keys(schema_object(RUN_PE, task))
        undeclared = [k.key for k in keys if k.interval is None or not outside(k)]
        assert not undeclared, f"declare a domain (core/domain.py) for {undeclared} (task={task})"


def test_the_walk_sees_the_keys_of_every_section_and_scheme():
    keys = {k.key for pe in SCHEMES for k in schema_keys(pe)}
    for expected in ("train.beta1", "eval.lengths", "sample.top_k", "inspect.windows", "model.dropout"):
        assert expected in keys
    assert {"data.val_fraction", "pe.npos", "pe.num_buckets", "pe.scaling.factor", "pe.init_L"} <= keys
    assert "train.resume" not in keys  # a bool is no number


@functools.cache
def schema_object(pe: str, task: str = NO_TASK) -> typing.Any:
    """The schema of a run of ``pe`` and ``task`` as its dataclasses, built once: for reading only."""
    return OmegaConf.to_object(schema(pe, task))


@functools.cache
def declared_choices() -> dict[str, tuple[str, tuple]]:
    """Every key that declares its choices (core.domain.choice), over every scheme's schema: key -> (a scheme whose
    schema has it, its choices)."""
    found = {}
    for pe, task in [(pe, NO_TASK) for pe in SCHEMES] + [("rope", task) for task in TASKS]:
        for leaf in leaves(schema_object(pe, task)):
            if choices_of(leaf.field) is not None:
                found.setdefault(leaf.key, (pe, task, choices_of(leaf.field)))
    return found


@functools.cache
def declared_nonempty() -> dict[str, tuple[str, str]]:
    """Every list key that declares it must name a value (core.domain's ``nonempty``), over every scheme's and
    task's schema: key -> (a scheme and a task whose schema has it)."""
    found = {}
    for pe, task in [(pe, NO_TASK) for pe in SCHEMES] + [("rope", task) for task in TASKS]:
        for leaf in leaves(schema_object(pe, task)):
            if is_nonempty(leaf.field):
                found.setdefault(leaf.key, (pe, task))
    return found


def test_the_nonempty_walk_finds_the_declared_ones():
    assert {"eval.length_multipliers", "eval.protocols"} <= set(declared_nonempty())


@pytest.mark.parametrize("key", sorted(declared_nonempty()))
def test_an_empty_list_where_a_value_is_needed_is_refused_in_one_line(key):
    """Each such key, read from the schema, given [] through the planner's check of the composed config."""
    pe, task = declared_nonempty()[key]
    cfg = compose_config([f"pe={pe}", f"task={task}", f"{key}=[]"])
    with pytest.raises(PosGPTError) as refused:
        validate(cfg)
    assert str(refused.value) == f"{key}=[] names nothing: it must name at least one value"


@pytest.mark.parametrize("key", sorted(declared_choices()))
def test_a_value_outside_a_declared_choice_is_refused_in_one_line(key):
    """Each key of a few words, read from the schema: each of its choices passes the check, a word outside them is
    refused naming the key, the value and the choices."""
    pe, task, choices = declared_choices()[key]
    config = OmegaConf.to_object(schema(pe, task))
    section_path, _, name = key.rpartition(".")
    section = functools.reduce(getattr, section_path.split("."), config)
    listed = isinstance(getattr(section, name), list)  # a list of them (eval.protocols): each element checked
    for value in choices:
        setattr(section, name, [value] if listed else value)
        check_domains(config)
    setattr(section, name, [choices[0], "no-such-choice"] if listed else "no-such-choice")
    with pytest.raises(PosGPTError) as refused:
        check_domains(config)
    named = f"{key}[1]" if listed else key
    assert str(refused.value) == f"{named}='no-such-choice' is not one of its choices: {', '.join(map(str, choices))}"


def test_the_choices_walk_finds_the_declared_ones():
    found = set(declared_choices())
    assert {"train.dtype", "train.init_from_pe", "train.distributed", "logging.wandb.mode"} <= found
    assert {"pe.scaling.type", "pe.remap.type", "eval.protocols", "data.source", "task.train_lengths"} <= found


# --- the domain itself --------------------------------------------------------------------------------------


def test_intervals_read_as_written_and_hold_only_finite_numbers():
    assert str(Interval(ge=0, lt=1)) == "[0, 1)"
    assert str(Interval(gt=0)) == "(0, inf)"
    assert str(Interval(le=2.5)) == "(-inf, 2.5]"
    assert 0 in Interval(ge=0, lt=1) and 1 not in Interval(ge=0, lt=1) and 0 not in Interval(gt=0)
    assert float("inf") not in Interval(gt=0) and float("nan") not in Interval()


@dataclasses.dataclass
class _Inner:
    rate: float = domain(0.5, gt=0, le=1)


@dataclasses.dataclass
class _Outer:
    lengths: list[int] | None = domain(None, ge=1)
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    name: str = "x"


def test_check_domains_names_the_first_value_outside():
    check_domains(_Outer())  # None passes
    check_domains(_Outer(lengths=[1, 2]))
    with pytest.raises(PosGPTError, match=r"^cfg\.lengths\[1\]=0 is out of its domain \[1, inf\)$"):
        check_domains(_Outer(lengths=[1, 0]), "cfg.")
    with pytest.raises(PosGPTError, match=r"^inner\.rate=1\.5 is out of its domain \(0, 1\]$"):
        check_domains(_Outer(inner=_Inner(rate=1.5)))


# --- every command refuses every out-of-domain value ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    command: str
    key: NumericKey
    value: int | float
    pe: str = RUN_PE  # the scheme train.py and speed.py are given for a pe. key

    @property
    def overrides(self) -> list[str]:
        scheme = [f"pe={self.pe}"] if self.key.key.startswith("pe.") and not COMMANDS[self.command] else []
        return [*scheme, f"{self.key.key}={f'[{self.value}]' if self.key.is_list else self.value}"]

    def expected(self) -> str:
        """A pattern of the error line: the key and its domain, or, for a key an evaluation may not change
        (the run-reading commands), that refusal: that the command never reads it, or that it is the run's."""
        if COMMANDS[self.command] and not may_change(self.key.key, eval_settings(RUN_PE)):
            if not reads(self.command, self.key.key):
                return re.escape(f"error: {self.command} does not read {self.key.key} (read by ") + ".*"
            return re.escape(f"error: {self.key.key} cannot be changed for an evaluation: ") + ".*"
        shown = f"{self.key.key}[0]" if self.key.is_list else self.key.key
        return re.escape(f"error: {shown}={self.value} is out of its domain {self.key.interval}")

    def __str__(self) -> str:
        return f"{self.command}:{' '.join(self.overrides)}"


def reads(script: str, key: str) -> bool:
    """Whether the schema declares that ``script`` reads ``key`` of a run of the RUN_PE scheme (core.domain)."""
    (name,) = [name for name, command in DECLARED_COMMANDS.items() if command == script]
    return name in readers_of(schema_object(RUN_PE), key).commands


def cases() -> list[Case]:
    """train.py: every bound of every key of every scheme. The other commands share train's path to the check
    (compose, then experiment.config.validate): one value per key, of every scheme for speed.py, and of the
    run's scheme for the commands that read a run."""
    found = []
    for command, reads_run in COMMANDS.items():
        for pe in [RUN_PE] if reads_run else SCHEMES:
            for key in schema_keys(pe):
                if pe != RUN_PE and not key.key.startswith("pe."):
                    continue  # the keys outside pe. are walked with RUN_PE
                values = outside(key) if command == "train.py" else outside(key)[:1]
                found += [Case(command, key, value, pe) for value in values]
    return found


CASES = cases()


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    runner = Runner(tmp_path_factory.getbasetemp())
    return make_run(tmp_path_factory.mktemp("domains") / RUN_PE, runner.corpus, f"pe={RUN_PE}")


def command_argv(command: str, overrides: list[str], run_dir: Path, workdir: Path) -> list[str]:
    """The command's arguments: a run to read, or (train.py) where Hydra would put the new run."""
    if COMMANDS[command]:
        return [f"run_dir={run_dir}", *overrides]
    if command == "train.py":
        return [f"hydra.run.dir={workdir / 'run'}", *overrides]
    return overrides


def run_in_process(command: str, argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """``python <command> <argv>`` in this process: the script runs as __main__ with sys.argv set, so Hydra's
    main (train.py) finds its configs as on the command line. Returns the exit code and stderr."""
    script = REPO / command
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    grad_enabled = torch.is_grad_enabled()  # eval.py and sample.py turn gradients off for the process
    code = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
    finally:
        torch.set_grad_enabled(grad_enabled)
    return code, capsys.readouterr().err


def sampled(cases: list[Case]) -> list:
    """The cases run through a command's entry point: the first of each command and every eighth; every other
    one of the eighths in the slow tier."""
    firsts = {case.command: i for i, case in reversed(list(enumerate(cases)))}
    return [
        case if i % 16 == 0 or firsts[case.command] == i else pytest.param(case, marks=pytest.mark.slow, id=str(case))
        for i, case in enumerate(cases)
        if i % 8 == 0 or firsts[case.command] == i
    ]


@functools.cache
def composed(pe: str):
    """The default config with ``pe=<pe>``, composed as the commands compose it (once per scheme)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("config", overrides=[f"pe={pe}"])


def check_refusal(case: Case) -> str:
    """What experiment.config.validate, the check every command runs after composing, says of the case's value,
    as the command prints it."""
    cfg = copy.deepcopy(composed(case.pe))
    OmegaConf.update(cfg, case.key.key, [case.value] if case.key.is_list else case.value)
    with pytest.raises(PosGPTError) as refused:
        validate(cfg)
    return f"error: {refused.value}"


# Every key of every scheme and each bound: train.py's cases hold every other command's keys and values (speed.py
# walks the pe. keys of every scheme, with one value each). The run-reading commands refuse most keys for
# another reason (an evaluation may not change them): their walk is on the entry point below.
@pytest.mark.parametrize("case", [case for case in CASES if case.command == "train.py"], ids=str)
def test_the_check_refuses_every_out_of_domain_value_of_every_key(case):
    assert re.fullmatch(case.expected(), check_refusal(case))


SAMPLED = sampled(CASES)


@pytest.mark.parametrize("case", SAMPLED, ids=str)
def test_every_command_refuses_out_of_domain_values_through_its_entry_point(
    case, rope_run, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = command_argv(case.command, case.overrides, rope_run, tmp_path)
    code, err = run_in_process(case.command, argv, capsys, monkeypatch)
    assert code == 2 and re.fullmatch(case.expected(), err.strip()), err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())  # nothing written
    if not COMMANDS[case.command]:
        assert err.strip() == check_refusal(case)  # the check the walk above runs is the one the command runs


SAMPLED_CASES = [getattr(entry, "values", [entry])[0] for entry in SAMPLED]


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [case for case in CASES if COMMANDS[case.command] and case not in SAMPLED_CASES], ids=str
)
def test_every_run_reading_command_refuses_every_out_of_domain_value(case, rope_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_in_process(
        case.command, command_argv(case.command, case.overrides, rope_run, tmp_path), capsys, monkeypatch
    )
    assert code == 2 and re.fullmatch(case.expected(), err.strip()), err


# One key per command, run as a real subprocess: the in-process walk answers exactly as the command line does.
SUBPROCESS_SAMPLE = {  # one key per command: the in-process walk covers the rest
    "train.py": ("train.min_lr_ratio",),
    "scripts/speed.py": ("pe.scaling.factor",),
    "eval.py": ("model.n_layer",),
    "sample.py": ("sample.top_k",),
    "scripts/inspect_attention.py": ("data.val_fraction",),
}


SUBPROCESS_CASES = list(  # one case a command: speed.py walks pe.scaling.factor once per scheme that has it
    {
        case.command: case
        for case in reversed(CASES)
        if case.key.key in SUBPROCESS_SAMPLE[case.command] and case.value == outside(case.key)[0]
    }.values()
)


@pytest.mark.slow
@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=str)
def test_the_command_line_answers_as_the_in_process_run(case, rope_run, tmp_path, capsys, monkeypatch):
    argv = command_argv(case.command, case.overrides, rope_run, tmp_path)
    done = subprocess.run([sys.executable, case.command, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert_one_line_error(done)
    monkeypatch.chdir(tmp_path)
    code, err = run_in_process(case.command, argv, capsys, monkeypatch)
    assert (done.returncode, done.stderr) == (code, err)
    assert code == 2 and re.fullmatch(case.expected(), err.strip()), err


# --- nothing shipped is out of its domain ---------------------------------------------------------------------


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


def assert_compositions_validate(combinations: list[tuple[str, ...]]) -> None:
    """Each (pe, model, data) of configs/ composes and passes the config's validation (None: the default)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        for choice in combinations:
            overrides = [f"{group}={option}" for group, option in zip(("pe", "model", "data"), choice) if option]
            cfg = compose("config", overrides=overrides)
            if len(cfg.pe.get("pattern", ())) > cfg.model.n_layer:  # a per-layer pattern needs its layers
                cfg = compose("config", overrides=[*overrides, f"model.n_layer={len(cfg.pe.pattern)}"])
            try:
                validate(cfg)
            except PosGPTError as error:
                pytest.fail(f"{' '.join(overrides)}: {error}")


@pytest.mark.slow  # every pair composed through Hydra
def test_every_scheme_with_every_model_and_every_corpus_validates():
    """The product of pe and model (RoPE and xPos need an even head dimension, a per-layer pattern a layer per
    entry: the checks relate them), and each data config once (no check relates data to the scheme or the model)."""
    pairs = itertools.product(group_options("pe"), group_options("model"), [None])
    assert_compositions_validate([*pairs, *((None, None, data) for data in group_options("data"))])
