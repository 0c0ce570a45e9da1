"""The scripts that read many runs (scripts/compare.py, scripts/export_results.py, scripts/check_below_length.py):
every option, generated from the script's own parser (tests/support/generated_options.py: each choice, a given
switch, a typed number's domain edges and the probes its type refuses, a path to write fresh, inside an input run
and under a file, the runs' names and one that no run has), on every kind of run set (language-model runs, task
runs, both): either the command runs to its end (exit 0; check_below_length's verdict 1 for a run that does not
hold as well) and every path its options name is written, or it refuses in one ``error:`` line, exit 2, with
nothing else printed, and the tree of its input runs and of its output folder is byte for byte as it was.

An option is refused where the script's rule says it must be: one read for a kind of run the set lacks (compare.py's
``build_parser`` readers, ``check_readers``), a set with a kind of run the script does not read (check_below_length
reads task runs), a value its type refuses, and a path inside an input run.

The runs are untrained tiny checkpoints (tests/support/tiny_checkpoint.py) evaluated in this process, two seeds of
a setting each; the scripts run through their command lines in this process (cli.here), check_below_length's
eval.py command lines too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import TINY, load_script
from generated_options import Case, command_line, generated_cases, parser_of, run_here, unwritable
from refusals import INSPECT, tree
from tiny_checkpoint import make_run

from core.files import atomic_write
from evaluation import attention_stats, plots

compare = load_script("compare")
export_results = load_script("export_results")
check_below_length = load_script("check_below_length")

# Two seeds of a language-model setting and of a task setting: evaluated as a study evaluates them (a task with a
# depth grid), with a validation loss logged and, for language-model runs, their attention inspected.
TEXT_RUN = ("pe=rope",)
TASK_RUN = ("pe=rope", "task=passkey", "train.seq_len=32", "eval.task_half_width=0.5")
TEXT_EVAL = ("eval.lengths=[16,32]", "eval.protocols=[nonoverlapping,sliding,streaming]", "eval.max_tokens=64")
# evaluated again: sliding rows of stride 1 added beside those of the default stride (half of each length)
STRIDE_EVAL = ("eval.lengths=[16,32]", "eval.protocols=[sliding]", "eval.stride=1", "eval.max_tokens=64")
TASK_EVAL = ("eval.length_multipliers=[1,2]", "eval.task_depths=[0.5]")
SEEDS = (1, 2)
RUN_SETS = {
    "text": tuple(f"rope-s{seed}" for seed in SEEDS),
    "task": tuple(f"passkey-rope-s{seed}" for seed in SEEDS),
    "mix": (*(f"rope-s{seed}" for seed in SEEDS), *(f"passkey-rope-s{seed}" for seed in SEEDS)),
}
KINDS = {"text": {"text"}, "task": {"task"}, "mix": {"text", "task"}}


def group_choices(*overrides: str) -> dict[str, str]:
    """The config group chosen by ``overrides`` (``pe=rope``), the last choice of each."""
    return dict(override.split("=", 1) for override in overrides if "." not in override.split("=", 1)[0])


# The names a name option is given: the config groups the runs were trained with (scheme, data, task)
NAMES = sorted({*group_choices(*TINY, *TEXT_RUN).values(), *group_choices(*TINY, *TASK_RUN).values()})


@dataclasses.dataclass(frozen=True)
class Script:
    """A script that reads many runs: the kind of run that reads each option's destination (None: any run), the
    kinds of run it takes, what every case gives it (an output of its own), its exit codes of a command that ran
    to its end, the options whose effect these runs cannot show (and why), and its generated cases."""

    path: str
    readers: dict[str, str | None]
    takes: frozenset[str]
    base: dict[str, str]
    verdicts: tuple[int, ...]
    unshown: dict[str, str]
    cases: list[Case]


def script(
    path: str,
    parser: argparse.ArgumentParser,
    takes: set[str],
    base: dict[str, str],
    readers: dict[str, str | None] | None = None,
    verdicts: tuple[int, ...] = (0,),
    unshown: dict[str, str] | None = None,
) -> Script:
    """The Script of ``path``, its cases generated from ``parser`` (``readers``: as compare.py's build_parser
    declares them; None: any run reads every option)."""
    cases = generated_cases(parser, NAMES, readers)
    readers = readers if readers is not None else {action.dest: None for action in parser._actions}
    return Script(path, readers, frozenset(takes), base, verdicts, unshown or {}, cases)


COMPARE_PARSER, COMPARE_READERS = compare.build_parser()
SCRIPTS = {
    "compare": script(
        "scripts/compare.py", COMPARE_PARSER, {"text", "task"}, {"--markdown": "{out}/c.md"}, COMPARE_READERS
    ),
    "export_results": script(
        "scripts/export_results.py", parser_of(export_results.parse_args), {"text", "task"}, {"--to": "{out}/export"}
    ),
    # task runs only (a language-model run is refused); exit 1 is its verdict that a run does not hold
    "check_below_length": script(
        "scripts/check_below_length.py",
        parser_of(check_below_length.parse_args),
        {"task"},
        {},
        verdicts=(0, 1),
        unshown={"min_ratio": "untrained runs score 0 at L, where no share of it holds"},
    ),
}


def test_every_option_of_every_script_is_generated_with_values_on_both_sides_of_its_domain():
    for name, reader in SCRIPTS.items():
        given = {dest for case in reader.cases for dest in case.dests}
        assert given == {dest for dest in reader.readers if dest not in ("help", "run_dirs")}, name
    shares = [case for case in SCRIPTS["compare"].cases if case.dests == ("ecl_absolute",)]
    assert [case.argv[1] for case in shares if case.parsed] == ["1e-12", "1"]  # (0, 1]'s edges
    assert {"0", "1.0000001", "nan"} <= {case.argv[1] for case in shares if not case.parsed}
    strides = [case for case in SCRIPTS["compare"].cases if case.dests[:1] == ("stride",)]
    assert [case.argv[1] for case in strides if case.parsed and len(case.dests) == 1] == ["1"]  # [1, inf)'s edge
    assert not any(case.parsed for case in strides if case.argv[1] in ("0", "-1"))  # refused as eval.stride is
    assert any(case.argv == ("--stride", "1", "--protocol", "sliding") for case in strides)  # read under sliding


@pytest.fixture(scope="module")
def runs(cli, tmp_path_factory) -> dict[str, Path]:
    """Every run of RUN_SETS by name: read by each case's copy, never written."""
    folder = tmp_path_factory.mktemp("many-runs")
    built = {}
    with drawn_not_rendered():
        for seed in SEEDS:
            built |= evaluated_runs(cli, folder, seed)
    return built


def evaluated_runs(cli, folder: Path, seed: int) -> dict[str, Path]:
    """Seed ``seed`` of the language-model setting and of the task setting, evaluated, by name."""
    text = make_run(folder / f"rope-s{seed}", cli.corpus, *TEXT_RUN, f"train.seed={seed}", seed=seed)
    task = make_run(folder / f"passkey-rope-s{seed}", cli.corpus, *TASK_RUN, f"train.seed={seed}", seed=seed)
    for run, evaluation in ((text, TEXT_EVAL), (text, STRIDE_EVAL), (task, TASK_EVAL)):
        done = cli.eval_here(run, *evaluation)
        assert done.returncode == 0, done.stderr
        (run / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2.5, "val_loss": 2.6}\n')
    done = cli.here("scripts/inspect_attention.py", f"run_dir={text}", *INSPECT)
    assert done.returncode == 0, done.stderr
    return {text.name: text, task.name: task}


@contextlib.contextmanager
def drawn_not_rendered() -> Iterator[None]:
    """Figures are drawn as the commands draw them, and written where they write them (through core.files'
    atomic_write), but not rasterized: matplotlib's rendering took nine tenths of a comparison's time, and is
    tests/evaluation/test_plots.py's to check."""

    def save(fig, path: str | Path) -> Path:
        return atomic_write(Path(path), f"a figure: {fig.get_suptitle()}\n")

    with pytest.MonkeyPatch.context() as patch:
        for module in (plots, attention_stats):  # attention_stats imports save by name
            patch.setattr(module, "save", save)
        yield


@pytest.fixture
def figures_not_rendered():
    with drawn_not_rendered():
        yield


@pytest.fixture
def eval_in_process(cli, monkeypatch):
    """check_below_length's ``python eval.py ...`` run through cli.here: its exit code and output, as bytes."""
    real = subprocess.run

    def run(command: list[str], *args, **kwargs) -> subprocess.CompletedProcess:
        if list(command[:2]) != [sys.executable, "eval.py"]:
            return real(command, *args, **kwargs)
        done = cli.here("eval.py", *command[2:])
        return subprocess.CompletedProcess(command, done.returncode, done.stdout.encode(), done.stderr.encode())

    monkeypatch.setattr(subprocess, "run", run)


def must_refuse(reader: Script, kinds: set[str], case: Case) -> list[str]:
    """Why the script's rule refuses ``case`` on runs of ``kinds`` (empty: it may run)."""
    why = [f"it takes no {kind} runs" for kind in sorted(kinds - reader.takes)]
    why += [
        f"{dest} is read for {reader.readers[dest]} runs"
        for dest in case.dests
        if reader.readers[dest] is not None and reader.readers[dest] not in kinds
    ]
    why += [] if case.parsed else ["its type refuses the value"]
    return why + unwritable(case)


def run_case(cli, reader: Script, case: Case, run_dirs: list[Path], out: Path) -> subprocess.CompletedProcess:
    """The script's command line: the runs, its base options that the case does not give, the case's; a
    traceback it let through as exit -1."""
    fill = {"{out}": str(out), "{run}": str(run_dirs[0])}
    return run_here(cli, reader.path, command_line(case, reader.base, map(str, run_dirs), (), fill))


def outcome(
    reader: Script, kinds: set[str], case: Case, done: subprocess.CompletedProcess, unchanged: bool, out: Path
) -> str | None:
    """What is wrong with ``done`` (None: it ran to its end or refused as the rule says); ``unchanged``: whether
    the input runs and the output folder are as they were."""
    lines = done.stderr.strip().splitlines()
    refused = done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and done.stdout == ""
    if "Traceback" in done.stderr:
        return f"a traceback: {done.stderr[-400:]}"
    if done.returncode == 2 or done.returncode not in reader.verdicts:
        if not refused:
            return f"exit {done.returncode}, not a one-line refusal: {done.stdout[-200:]!r} {done.stderr[-400:]!r}"
        return None if unchanged else f"refused after writing: {lines[0]}"
    why = must_refuse(reader, kinds, case)
    if why:
        return f"ran to its end (exit {done.returncode}) where its rule refuses it ({'; '.join(why)})"
    missing = [path for path in case.outputs if not Path(path.replace("{out}", str(out))).exists()]
    return f"exit {done.returncode} without writing {missing}" if missing else None


def observed(done: subprocess.CompletedProcess, out: Path, before: dict) -> tuple:
    """What a command that ran to its end printed and wrote in ``out`` (its paths written as ``{out}``)."""
    written = {name: data for name, data in tree(out).items() if before.get(name) != data}
    return done.stdout.replace(str(out), "{out}"), written


def ignored(reader: Script, case: Case, shown: dict[tuple[str, ...], tuple]) -> str | None:
    """A typed number's value that changes nothing the command prints or writes, beside the same command line
    without it: read as if not given (a 0 taken for "no value"), unless these runs cannot show its effect."""
    if not case.number or case.dests[0] in reader.unshown or shown.get(case.without) != shown[case.argv]:
        return None
    return f"prints and writes what {' '.join(case.without) or 'no option'} does: the value is ignored"


def copied(runs: dict[str, Path], members: tuple[str, ...], folder: Path) -> list[Path]:
    """A fresh copy of the runs ``members`` in ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    return [Path(shutil.copytree(runs[member], folder / member)) for member in members]


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_option_on_every_kind_of_runs_runs_to_its_end_or_is_refused_before_any_write(
    cli, runs, eval_in_process, figures_not_rendered, tmp_path, name
):
    """Each case on a copy of the runs, hashed after every case (and copied afresh where a command that ran to
    its end wrote in them: check_below_length's evaluations), into an output folder of its own."""
    reader = SCRIPTS[name]
    problems, ran = [], set()
    for set_name, members in RUN_SETS.items():
        run_dirs = copied(runs, members, tmp_path / set_name)
        inputs, shown = tree(tmp_path / set_name), {}
        for i, case in enumerate(reader.cases):
            out = tmp_path / f"out-{set_name}-{i}"
            out.mkdir()
            (out / "file").write_text("a file, not a folder")
            before = tree(out)
            done = run_case(cli, reader, case, run_dirs, out)
            after = tree(tmp_path / set_name)
            problem = outcome(reader, KINDS[set_name], case, done, after == inputs and tree(out) == before, out)
            if problem is None and done.returncode != 2:
                shown[case.argv] = observed(done, out, before)
                problem = ignored(reader, case, shown)
            if problem:
                problems.append(f"{set_name}: {case.name}: {problem}")
            elif done.returncode != 2:
                ran.update(case.dests)
            if after != inputs:
                run_dirs = copied(runs, members, tmp_path / set_name)
            shutil.rmtree(out)
    assert not problems, "\n".join(problems)
    unread = {dest for case in reader.cases for dest in case.dests} - ran
    assert not unread, f"never ran to its end: {sorted(unread)}"  # every option did what it says somewhere
