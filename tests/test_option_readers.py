"""Every option of compare.py is a setting with declared readers (scripts/compare.py, OPTION_GROUPS): given for runs
none of which reads it, it is refused in one line before anything is written, never silently ignored with exit 0.

The members are generated from compare.py's own parser: each option read only by language-model runs is given
for a task run, each read only by task runs for a language-model run, with a value made from its declared type.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import compare
import pytest
from cli_runs import evaluated_run
from test_refusals_leave_no_trace import TINY_MQAR, refused
from tiny_checkpoint import make_run


def declared_options() -> list[tuple[str, str, list[str]]]:
    """(option, the kind of run that reads it, a command line giving it a value away from its default)."""
    readers = compare.parse_args.__globals__["OPTION_GROUPS"]
    assert set(readers.values()) == {"text", "task", None}
    parser = compare.ArgumentParser()
    kinds = {}
    for add, kind in ((compare.add_selection_options, "text"), (compare.add_perplexity_options, "text")):
        before = len(parser._actions)
        add(parser)
        kinds.update({action.dest: kind for action in parser._actions[before:]})
    before = len(parser._actions)
    compare.add_task_options(parser)
    kinds.update({action.dest: "task" for action in parser._actions[before:]})
    options = []
    for action in parser._actions:
        if not action.option_strings or action.dest in compare.READ_FOR_ANY_RUN or action.dest == "help":
            continue
        options.append((action.option_strings[-1], kinds[action.dest], _value(action)))
    return options


def _value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return [action.option_strings[-1]]
    if action.choices:
        value = next(choice for choice in action.choices if choice != action.default)
    elif action.type is Path:
        value = f"OUT/{action.dest}.{'csv' if action.dest.endswith('csv') else 'png'}"
    elif action.type in (int, float) or getattr(action.type, "__name__", "").startswith(("whole", "fraction")):
        value = "4" if action.type is int else "0.75"
    else:
        value = "x"
    return [action.option_strings[-1], str(value)]


OPTIONS = declared_options()


def test_every_option_of_a_kind_is_generated():
    kinds = {kind for _, kind, _ in OPTIONS}
    assert kinds == {"text", "task"} and len(OPTIONS) >= 10


@pytest.fixture(scope="module")
def runs(cli, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("readers")
    task = make_run(folder / "mqar-rope-s1", cli.corpus, *TINY_MQAR)
    done = cli.eval_here(task, "eval.length_multipliers=[1,2]")
    assert done.returncode == 0, done.stderr
    return {"text": evaluated_run(cli, folder), "task": task}


@pytest.mark.parametrize("option, kind, argv", OPTIONS, ids=[option for option, _, _ in OPTIONS])
def test_an_option_no_run_reads_is_refused_before_any_output(cli, runs, tmp_path, option, kind, argv):
    other = "task" if kind == "text" else "text"
    run = Path(shutil.copytree(runs[other], tmp_path / runs[other].name))
    command = [arg.replace("OUT", str(tmp_path / "out")) for arg in argv]
    refused(cli, tmp_path, ("scripts/compare.py", str(run), "--markdown", str(tmp_path / "c.md"), *command), option)
