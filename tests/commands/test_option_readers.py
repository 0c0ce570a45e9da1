"""Every option of compare.py, and every setting given to speed.py and estimate.py, has declared readers
(scripts/compare.py's OPTION_GROUPS; the schema's sections and fields): given where nothing reads it, it is refused
in one line before anything is written, never silently ignored with exit 0.

The members are generated: compare.py's options from its own parser (each option read only by language-model runs
given for a task run, and the reverse, with a value made from its declared type), the benchmarks' settings from
the schema (a setting of each section they do not read).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import compare
import pytest
from cli_runs import assert_one_line_error, evaluated_run
from omegaconf import OmegaConf
from refusals import TINY_MQAR, refused
from tiny_checkpoint import make_run

from experiment.compose import compose_config
from experiment.config import command_reads


def declared_options() -> list[tuple[str, str, list[str]]]:
    """(option, the kind of run that reads it, a command line giving it a value away from its default)."""
    assert set(compare.OPTION_GROUPS.values()) == {"text", "task", None}
    parser, kinds = compare.build_parser()
    return [
        (action.option_strings[-1], kinds[action.dest], _value(action))
        for action in parser._actions
        if action.option_strings and action.dest != "help" and kinds[action.dest] is not None
    ]


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


@pytest.mark.slow
@pytest.mark.parametrize("option, kind, argv", OPTIONS, ids=[option for option, _, _ in OPTIONS])
def test_an_option_no_run_reads_is_refused_before_any_output(cli, runs, tmp_path, option, kind, argv):
    other = "task" if kind == "text" else "text"
    run = Path(shutil.copytree(runs[other], tmp_path / runs[other].name))
    command = [arg.replace("OUT", str(tmp_path / "out")) for arg in argv]
    refused(cli, tmp_path, ("scripts/compare.py", str(run), "--markdown", str(tmp_path / "c.md"), *command), option)


def unread_sections(command: str) -> list[str]:
    """A setting of each section of the schema that ``command`` does not read (the section's first field that it
    does not), as the section declares; generated, so a section added later is covered."""
    config = OmegaConf.to_object(compose_config([]))
    keys = []
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        for field in dataclasses.fields(value):
            key = f"{section.name}.{field.name}"
            leaf = not dataclasses.is_dataclass(getattr(value, field.name))
            if leaf and not command_reads(config, command, key) and not isinstance(getattr(value, field.name), list):
                keys.append(key)
                break
    return keys


BENCHMARK_CASES = [
    (script, key) for script in ("scripts/speed.py", "scripts/estimate.py") for key in unread_sections(script)
]


def test_the_benchmarks_read_no_data_eval_sample_or_inspect_settings():
    sections = {key.split(".")[0] for script, key in BENCHMARK_CASES}
    assert {"data", "eval", "sample", "inspect", "logging"} <= sections


@pytest.mark.slow
@pytest.mark.parametrize("script, key", BENCHMARK_CASES)
def test_a_benchmark_refuses_a_setting_only_other_commands_read(cli, script, key):
    value = OmegaConf.select(compose_config([]), key)
    given = f"{key}={json.dumps(value) if not isinstance(value, str) else value + '_x'}"
    done = cli.here(script, "model=tiny", given)
    assert_one_line_error(done, f"{script} does not read {key}")
