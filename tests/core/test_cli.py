"""A script's option that only another option reads declares it (core.cli.ArgumentParser's ``requires``), and is
refused in one line, naming that option, when given without it; so is a config setting that the script reads only
with one of its options (``reads``); two options of which one replaces the other are a mutually exclusive group; an
option given twice is refused. The members are generated from the scripts' own sources: every ``requires=``, every
setting of a ``reads=`` and every mutually exclusive group of scripts/*.py is given alone (or both), through the
script's real command line."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys

import pytest
from cli_runs import assert_one_line_error, load_script
from refusals import refused
from repo_root import REPO

from core.cli import ArgumentParser, exit_on_user_error
from core.errors import PosGPTError

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
    ]


def _flag(call: ast.Call) -> str:
    return next(arg.value for arg in call.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"))


def declared_requires() -> list[tuple[str, str, str]]:
    """(script, option, the option it requires) for every add_argument(..., requires=...) of the scripts."""
    found = []
    for script in SCRIPTS:
        for call in _calls(ast.parse(script.read_text()), "add_argument"):
            requires = next((k.value.value for k in call.keywords if k.arg == "requires"), None)
            if requires is not None:
                found.append((f"scripts/{script.name}", _flag(call), requires))
    return found


def declared_reads() -> list[tuple[str, str, str]]:
    """(script, option, a config setting it alone makes the script read) for every add_argument(..., reads=...)."""
    found = []
    for script in SCRIPTS:
        for call in _calls(ast.parse(script.read_text()), "add_argument"):
            reads = next((k.value for k in call.keywords if k.arg == "reads"), None)
            if isinstance(reads, ast.Name):  # a tuple the script builds (estimate.py's MEASURED)
                keys = getattr(load_script(script.stem), reads.id)
            else:
                keys = ast.literal_eval(reads) if reads is not None else ()
            found += [(f"scripts/{script.name}", _flag(call), key) for key in keys]
    return found


def exclusive_pairs() -> list[tuple[str, str, str]]:
    """(script, option, option) for each pair of a mutually exclusive group the scripts declare."""
    found = []
    for script in SCRIPTS:
        tree = ast.parse(script.read_text())
        for assign in [node for node in ast.walk(tree) if isinstance(node, ast.Assign)]:
            value = assign.value
            if isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "add_mutually_exclusive_group":
                group = assign.targets[0].id
                flags = [_flag(c) for c in _calls(tree, "add_argument") if getattr(c.func.value, "id", "") == group]
                found += [(f"scripts/{script.name}", a, b) for i, a in enumerate(flags) for b in flags[i + 1 :]]
    return found


VALUES = {"--eval-steps": "5", "--eval-length": "32", "--seeds": "2", "--seed-list": "1"}


def test_the_members_are_found_in_the_scripts():
    assert ("scripts/speed.py", "--eval-steps", "--eval-length") in declared_requires()
    assert ("scripts/extension_study.py", "--seeds", "--seed-list") in exclusive_pairs()
    assert ("scripts/estimate.py", "--eval-length", "eval.batch_tokens") in declared_reads()
    assert ("scripts/estimate.py", "--measure", "train.lr") in declared_reads()
    assert all(option in VALUES for _, option, _ in declared_requires())
    assert all(a in VALUES and b in VALUES for _, a, b in exclusive_pairs())


@pytest.mark.parametrize("script, option, requires", declared_requires())
def test_an_option_given_without_the_one_that_reads_it_is_refused(cli, tmp_path, script, option, requires):
    refused(cli, tmp_path, (script, option, VALUES[option]), option, f"read only with {requires}")


@pytest.mark.parametrize("script, option, key", declared_reads())
def test_a_setting_given_without_the_option_that_reads_it_is_refused(cli, tmp_path, script, option, key):
    """speed.py and estimate.py read eval.batch_tokens only to score (--eval-length): accepted without it, it was
    never read."""
    refused(cli, tmp_path, (script, "model=tiny", f"{key}=64"), key, f"read only with {option}")


def test_reads_refuses_only_a_setting_given_without_its_option():
    parser = ArgumentParser(prog="x")
    parser.add_argument("--length", type=int, reads=("eval.batch_tokens",))
    assert parser.parse_known_args(["eval.max_tokens=4"])[1] == ["eval.max_tokens=4"]
    assert parser.parse_known_args(["--length", "4", "eval.batch_tokens=8"])[1] == ["eval.batch_tokens=8"]
    # every spelling Hydra's grammar has for setting or deleting a key (core.config_keys.overridden_keys reads them)
    for spelling in ("eval.batch_tokens=8", "+eval.batch_tokens=8", "++eval.batch_tokens=8", "~eval.batch_tokens"):
        with pytest.raises(PosGPTError, match="eval.batch_tokens is read only with --length: give --length or drop"):
            parser.parse_known_args([spelling])


@pytest.mark.parametrize("script, first, second", exclusive_pairs())
def test_two_options_of_which_one_replaces_the_other_are_refused_together(cli, tmp_path, script, first, second):
    argv = (script, str(tmp_path / "study"), first, VALUES[first], second, VALUES[second], "--list")
    refused(cli, tmp_path, argv, "not allowed with")


def test_requires_refuses_only_an_option_away_from_its_default():
    parser = ArgumentParser(prog="x")
    parser.add_argument("--length", type=int)
    parser.add_argument("--steps", type=int, default=2, requires="--length")
    assert parser.parse_args(["--steps", "2"]).steps == 2  # its default: nothing to read
    assert parser.parse_args(["--length", "4", "--steps", "3"]).steps == 3
    with pytest.raises(PosGPTError, match="--steps is read only with --length: give --length or drop it"):
        parser.parse_args(["--steps", "3"])


def test_an_option_given_twice_is_refused_under_each_of_its_spellings():
    """argparse keeps the last value and drops the first without a word: refused, whichever name, abbreviation or
    ``=`` form gives it, in a subcommand too; a switch, a positional and one given once are as argparse parses them."""
    parser = ArgumentParser(prog="x")
    parser.add_argument("-p", "--plan-to")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("rest", nargs="*")
    spellings = ["--plan-to", "--plan", "-p"]
    for first in spellings:
        for second in spellings:
            for argv in ([first, "a", second, "b"], [f"{first}=a" if first != "-p" else "-pa", "d", second, "b"]):
                with pytest.raises(PosGPTError, match=r"--plan-to is given twice \(a, b\): give it once"):
                    parser.parse_intermixed_args(argv)
    parsed = parser.parse_intermixed_args(["--plan-to", "a", "d", "--list", "--list", "k=v"])
    assert (parsed.plan_to, parsed.list, parsed.rest) == ("a", True, ["d", "k=v"])
    assert parser.parse_intermixed_args(["--plan-to", "c"]).plan_to == "c"  # a new parse starts afresh
    commands = ArgumentParser(prog="y").add_subparsers(dest="command")
    sub = commands.add_parser("go")
    sub.add_argument("--n")
    with pytest.raises(PosGPTError, match="--n is given twice"):
        sub.parse_args(["--n", "1", "--n", "2"])


def test_study_refuses_the_plan_file_given_on_its_command_line(cli, tmp_path):
    """study.sh names the file it reads its plan from; a --plan-to of the user's replaced it, and study.sh read an
    empty plan."""
    root = tmp_path / "root"
    root.mkdir()
    done = subprocess.run(
        ["bash", "scripts/study.sh", "--plan-to", str(root / "plan"), "--list", str(root / "study")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(done, "--plan-to is given twice")
    assert list(root.iterdir()) == []


MAIN = """import gc, sys
from core.cli import exit_on_user_error

@exit_on_user_error
def main():
    print(gc.get_freeze_count(), gc.isenabled())

gc.disable()  # as core.interrupts pauses it in a command's process
main()
"""


@pytest.mark.slow  # a process of its own
def test_a_commands_own_process_freezes_what_its_imports_built_and_an_importer_keeps_its_collector():
    """exit_on_user_error in a command's process (its main in __main__) takes what the imports built out of the
    cyclic collector's work, the last collection at exit included; a test process that imports a main and calls it
    keeps its collector as it was. The collector is paused while a command's libraries import
    (core.interrupts, in the command's own process only) and resumed there."""
    done = subprocess.run([sys.executable, "-c", MAIN], cwd=REPO, capture_output=True, text=True, check=True)
    frozen, enabled = done.stdout.split()
    assert int(frozen) > 0 and enabled == "True"  # a process that froze nothing counts 0
    before = gc.get_freeze_count()
    exit_on_user_error(lambda: None)()
    assert gc.get_freeze_count() == before
