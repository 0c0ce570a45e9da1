"""The scripts that are not a run reader's walk (tests/commands/test_many_run_readers_property.py covers compare,
export and check_below_length; test_run_readers_property.py eval, sample and inspect_attention): the benchmarks
(speed.py, estimate.py), slim_results.py, attention_on_value.py, repeated_passages.py's two commands and
study_check.py (the planner that declares scripts/study.sh's options). Every
option, generated from the script's own parser (tests/support/generated_options.py: each choice, a given switch, a
typed number's domain edges and the probes its type refuses, a path to write fresh, inside a run and under a file,
an option given with the one it is read with), on the inputs the script takes: either the command runs to its end
(exit 0), every path its options name is written and a typed number's value changes what it prints or writes, or it
refuses in one ``error:`` line, exit 2, with nothing else printed, and its inputs and output folder byte for byte
as they were.

Options that cannot run to their end on this machine (a CUDA kernel, a compilation) must still be refused so, in
one line, never accepted and ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runs import load_script
from generated_options import Case, command_line, generated_cases, parser_of, run_here, unwritable
from refusals import TINY_MQAR, tree
from tiny_checkpoint import make_run

speed = load_script("speed")
estimate = load_script("estimate")
slim_results = load_script("slim_results")
attention_on_value = load_script("attention_on_value")
repeated_passages = load_script("repeated_passages")
study_check = load_script("study_check")

BENCH_MODEL = ("model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.vocab_size=512", "train.seq_len=16")
BENCH_MODEL += ("train.batch_size=2",)
BENCH_RUNTIME = ("train.device=cpu", "train.num_threads=1")  # speed.py reads them; estimate.py with --measure
# the settings a script reads only with one of its options (core.cli's ``reads``), given with it: a small batch, the
# runtime of a measurement
BENCH_WITH = {"--eval-length": ("eval.batch_tokens=64",), "--measure": BENCH_RUNTIME}
# What a measurement prints that differs between two runs of the same command line: a clock's or the memory's
MEASURED = re.compile(
    r'"(tokens_per_s|mfu|peak_memory_mb|step_ms|cpu_share|[a-z_]*measured[a-z_]*|process_before_mb)"'
    r": [^,}\n]+"
)


def subcommand(parse_args: Callable, name: str) -> argparse.ArgumentParser:
    """The parser of a script's subcommand ``name``."""
    (commands,) = [a for a in parser_of(parse_args)._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


@dataclasses.dataclass(frozen=True)
class Script:
    """A script: the arguments before its options (placeholders: ``{out}``, a folder of the case's own holding a
    file named ``file``; ``{run}``, a text run; ``{mqar}``, an MQAR run; ``{study}``, exported runs), the options
    every case gets unless it gives them, the arguments after its options, the options that cannot run to their end
    here (and why), and its generated cases."""

    path: str
    before: tuple[str, ...]
    base: dict[str, str]
    after: tuple[str, ...]
    cases: list[Case]
    unrun: dict[str, str] = dataclasses.field(default_factory=dict)


SCRIPTS = {
    "speed": Script(
        "scripts/speed.py",
        (),
        {"--warmup": "2", "--steps": "2"},  # away from their domains' edges, which the cases give
        (*BENCH_MODEL, *BENCH_RUNTIME),
        generated_cases(parser_of(speed.parse_args), ()),
        {
            "compile_mode": "needs train.compile=true: a compilation, tests/scripts/test_speed.py's to run",
            "sdpa_backend": "needs a CUDA device",
        },
    ),
    "estimate": Script("scripts/estimate.py", (), {}, BENCH_MODEL, generated_cases(parser_of(estimate.parse_args), ())),
    "slim_results": Script(
        "scripts/slim_results.py", ("{study}",), {}, (), generated_cases(parser_of(slim_results.parse_args), ())
    ),
    "attention_on_value": Script(
        "scripts/attention_on_value.py",
        ("{mqar}",),
        {},
        (),
        generated_cases(parser_of(attention_on_value.parse_args), ()),
    ),
    "repeated_passages corpus": Script(
        "scripts/repeated_passages.py",
        ("corpus", "{out}/corpus.jsonl"),
        {"--rows": "2"},
        (),
        generated_cases(subcommand(repeated_passages.parse_args, "corpus"), ()),
    ),
    # scripts/study.sh's options, declared by the planner it calls: a tiny model that fits the task study's tasks
    "study_check": Script(
        "scripts/study_check.py",
        ("{out}/study",),
        {"--plan-to": "{out}/plan", "--schemes": "rope"},
        # the tasks' own training length, past the windows of RoPE's study variations (32)
        ("model.n_layer=1", "model.n_head=2", "model.n_embd=16", "train.seq_len=64", "train.max_steps=1"),
        generated_cases(parser_of(study_check.parse_args), ("rope", "passkey")),
    ),
}
# repeated_passages.py halves takes run directories and no option (tests/scripts/test_repeated_passages.py runs it)
HALVES = generated_cases(subcommand(repeated_passages.parse_args, "halves"), ())


def test_every_option_is_generated_with_values_on_both_sides_of_its_domain():
    options = {name: {dest for case in script.cases for dest in case.dests} for name, script in SCRIPTS.items()}
    assert options["speed"] == {
        "warmup",
        "steps",
        "record",
        "compile_mode",
        "sdpa_backend",
        "eval_length",
        "eval_steps",
    }
    assert options["estimate"] == {"eval_length", "measure", "record"} and options["slim_results"] == {"csv"}
    assert options["study_check"] == {"plan_to", "seeds", "seed_list", "schemes", "tasks", "list"}
    assert [case.argv for case in HALVES] == [()]  # an option added to it would be generated here: give it a Script
    warmups = [case.argv[1] for case in SCRIPTS["speed"].cases if case.dests == ("warmup",)]
    assert warmups[:2] == ["0", "1"] and "-1" in warmups  # [0, inf)'s edge, and the probe below it
    assert any(case.dests == ("eval_steps", "eval_length") and case.parsed for case in SCRIPTS["speed"].cases)


@pytest.fixture(scope="module")
def inputs(cli, tmp_path_factory) -> dict[str, Path]:
    """A text run (evaluated), an MQAR run, and the text run exported as a study; read by each case's copy."""
    folder = tmp_path_factory.mktemp("script-inputs")
    run = make_run(folder / "runs" / "rope-s1", cli.corpus, "pe=rope", "model.embedding=gpt2")
    done = cli.eval_here(run, "eval.lengths=[16,32]", "eval.max_tokens=64")
    assert done.returncode == 0, done.stderr
    mqar = make_run(folder / "runs" / "mqar-rope-s1", cli.corpus, *TINY_MQAR)
    done = cli.here("scripts/export_results.py", str(run), "--to", str(folder / "study"))
    assert done.returncode == 0, done.stderr
    return {"{run}": run, "{mqar}": mqar, "{study}": folder / "study"}


def run_case(cli, script: Script, case: Case, fill: dict[str, str]) -> subprocess.CompletedProcess:
    given = [setting for option, settings in BENCH_WITH.items() if option in case.argv for setting in settings]
    return run_here(cli, script.path, command_line(case, script.base, script.before, (*script.after, *given), fill))


def outcome(script: Script, case: Case, done: subprocess.CompletedProcess, unchanged: bool, out: Path) -> str | None:
    """What is wrong with ``done`` (None: it ran to its end, or refused in one line leaving everything as it was)."""
    lines = done.stderr.strip().splitlines()
    if done.returncode != 0:
        one_line = done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not done.stdout
        if not one_line:
            return f"exit {done.returncode}, not a one-line refusal: {done.stdout[-200:]!r} {done.stderr[-400:]!r}"
        return None if unchanged else f"refused after writing: {lines[0]}"
    why = [] if case.parsed else ["its type refuses the value"]
    why += unwritable(case)
    why += [f"{dest} {script.unrun[dest]}" for dest in case.dests if dest in script.unrun]
    if why:
        return f"ran to its end where it must be refused ({'; '.join(why)})"
    missing = [path for path in case.outputs if not Path(path.replace("{out}", str(out))).exists()]
    return f"exit 0 without writing {missing}" if missing else None


def observed(done: subprocess.CompletedProcess, out: Path, before: dict, fill: dict[str, str]) -> tuple:
    """What a command that ran to its end printed (measurements left out) and wrote in ``out``."""
    printed = MEASURED.sub(r'"\1": _', done.stdout)
    written = {name: data for name, data in tree(out).items() if before.get(name) != data}
    for placeholder, value in fill.items():  # a case's own folders, named in what it prints or writes
        printed = printed.replace(value, placeholder)
        written = {
            name: data.replace(value.encode(), placeholder.encode()) if isinstance(data, bytes) else data
            for name, data in written.items()
        }
    return printed, written


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_option_runs_to_its_end_or_is_refused_before_any_write(cli, inputs, tmp_path, name):
    """Each case on a fresh copy of the inputs, hashed before and after, with an output folder of its own."""
    script, problems, ran, shown = SCRIPTS[name], [], set(), {}
    for i, case in enumerate(script.cases):
        copies = tmp_path / f"inputs-{i}"
        fill = {
            key: str(shutil.copytree(path, copies / path.relative_to(path.parents[1]))) for key, path in inputs.items()
        }
        out = tmp_path / f"out-{i}"
        out.mkdir()
        (out / "file").write_text("a file, not a folder")
        fill["{out}"] = str(out)
        before, given = tree(out), tree(copies)
        done = run_case(cli, script, case, fill)
        problem = outcome(script, case, done, tree(copies) == given and tree(out) == before, out)
        if problem is None and done.returncode == 0:
            shown[case.argv] = observed(done, out, before, fill)
            if case.number and shown.get(case.without) == shown[case.argv]:
                problem = f"prints and writes what {' '.join(case.without) or 'no option'} does: the value is ignored"
            ran.update(case.dests)
        if problem:
            problems.append(f"{case.name}: {problem}")
        shutil.rmtree(copies)
        shutil.rmtree(out)
    assert not problems, "\n".join(problems)
    unread = {dest for case in script.cases for dest in case.dests} - ran - set(script.unrun)
    assert not unread, f"never ran to its end: {sorted(unread)}"  # every option did what it says somewhere
