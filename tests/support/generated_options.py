"""Command lines generated from what a script's argparse parser declares: each option's choices, a given switch, the
edges of a typed number's domain as the type itself draws them, paths to write (a fresh one, one inside an input run,
one under a file), and names. The property test of the scripts that read many runs
(tests/commands/test_many_run_readers_property.py) gives these to the scripts instead of a list of cases.

A value holds placeholders that the test fills per case: ``{out}``, a folder of its own that holds a file named
``file``, and ``{run}``, the first input run.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

# Probes of a number's domain in increasing order, and two that are no number in any domain. A type (int, a
# function that checks an interval) accepts some; its domain's edges are the accepted probes next to a refused one.
ORDERED_NUMBERS = ("-1", "0", "1e-12", "0.5", "1", "1.0000001", "inf")
NOT_NUMBERS = ("nan", "x")
UNKNOWN_NAME = "x"  # a name no run has
# The file format a path option writes, by the last word of its destination; any other: a plot
SUFFIXES = {"markdown": ".md", "csv": ".csv", "json": ".json", "to": ""}  # "to": a folder
PATH_PLACES = {"fresh": "{out}", "in a run": "{run}/eval", "under a file": "{out}/file"}


@dataclasses.dataclass(frozen=True)
class Case:
    """A command line's options: what they set (by destination), whether the parser accepts their values, the
    paths they name for writing (written where the command runs to its end), the command line without its first
    option, and whether that option is a typed number (whose value must change what the command does)."""

    argv: tuple[str, ...]
    dests: tuple[str, ...]
    parsed: bool
    outputs: tuple[str, ...]
    without: tuple[str, ...] = ()
    number: bool = False

    @property
    def name(self) -> str:
        return " ".join(self.argv) or "(no option)"


class _Caught(Exception):
    pass


def parser_of(parse_args: Callable[[list[str]], Any]) -> argparse.ArgumentParser:
    """The parser that a script's ``parse_args(argv)`` builds, caught as it starts to parse (nothing is parsed)."""
    caught = []

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        caught.append(self)
        raise _Caught

    # parse_args, parse_intermixed_args and a script's own parse_known_args all come through argparse's
    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", catch):
        try:
            parse_args([])
        except _Caught:
            pass
    return caught[0]


def accepts(action: argparse.Action, text: str) -> bool:
    """Whether the option's type takes ``text`` (argparse refuses what its type raises on)."""
    try:
        action.type(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False
    return True


def probes(action: argparse.Action) -> list[str]:
    """ORDERED_NUMBERS, and the least whole number the type declares (core.cli.count's ``minimum``) and the one
    below it, in increasing order: a domain [2, inf) has its edge among the probes too."""
    minimum = getattr(action.type, "minimum", None)
    extra = () if minimum is None else (str(minimum - 1), str(minimum))
    return sorted(dict.fromkeys((*ORDERED_NUMBERS, *extra)), key=float)


def number_values(action: argparse.Action) -> list[str]:
    """Every probe the type refuses, and the accepted probes at its domain's edges (next to a refused probe, or
    at an end of the probes)."""
    ordered = probes(action)
    taken = [accepts(action, probe) for probe in ordered]
    edges = [
        probe
        for i, probe in enumerate(ordered)
        if taken[i] and (i in (0, len(taken) - 1) or not taken[i - 1] or not taken[i + 1])
    ]
    refused = [probe for probe, ok in zip(ordered, taken) if not ok]
    return [*edges, *refused, *(probe for probe in NOT_NUMBERS if not accepts(action, probe))]


def path_values(action: argparse.Action) -> list[str]:
    """A path of the option's format, named after it, in each of PATH_PLACES."""
    suffix = SUFFIXES.get(action.dest.rsplit("_", 1)[-1], ".png")
    return [f"{place}/{action.dest}{suffix}" for place in PATH_PLACES.values()]


def option_values(action: argparse.Action, names: Iterable[str]) -> list[str | None]:
    """The values an option is given (None: a switch, given alone): its choices away from its default, a path,
    a typed number's probes, or ``names`` and one that no run has."""
    if action.nargs == 0:
        return [None]
    if action.choices:
        return [str(choice) for choice in action.choices if choice != action.default]
    if action.type is Path:
        return path_values(action)
    if is_number(action):
        return number_values(action)
    return [*names, UNKNOWN_NAME]


def takes_names(action: argparse.Action) -> bool:
    """A name, or a list of names (a type that says so in the name argparse gives it in messages)."""
    return action.type in (None, str) or "names" in getattr(action.type, "__name__", "")


def is_number(action: argparse.Action) -> bool:
    return action.nargs != 0 and not action.choices and action.type is not Path and not takes_names(action)


def _case(actions: list[tuple[argparse.Action, str | None]]) -> Case:
    argv, outputs, parsed = [], [], True
    for action, value in actions:
        argv += [action.option_strings[-1], *([] if value is None else [value])]
        if action.type is Path and value is not None:
            outputs.append(value)
        if is_number(action) and value is not None:
            parsed = parsed and accepts(action, value)
    first = 1 if actions[0][1] is None else 2
    dests = tuple(action.dest for action, _ in actions)
    return Case(tuple(argv), dests, parsed, tuple(outputs), tuple(argv[first:]), is_number(actions[0][0]))


def generated_cases(
    parser: argparse.ArgumentParser, names: Iterable[str], readers: Mapping[str, str | None] | None = None
) -> list[Case]:
    """No option; each option with each of its values; and each value a typed number's type accepts beside each
    choice of every option with choices that the same kind of run reads (``readers``: the kind of run that reads
    each destination; None: every option is read by any run): a number may be read under one choice only (a
    sliding stride)."""
    names = list(names)
    options = [action for action in parser._actions if action.option_strings and action.dest != "help"]
    kind = (lambda action: readers[action.dest]) if readers is not None else (lambda action: None)
    cases = [Case((), (), True, ())]
    cases += [_case([(action, value)]) for action in options for value in option_values(action, names)]
    cases += [_case([(action, value), required]) for action, value, required in _with_required(parser, names)]
    cases += [
        _case([(action, value), (chooser, choice)])
        for action in options
        if is_number(action)
        for value in number_values(action)
        if accepts(action, value)
        for chooser in options
        if chooser.choices and kind(chooser) == kind(action)
        for choice in option_values(chooser, names)
    ]
    return cases


def _with_required(parser: argparse.ArgumentParser, names: list[str]) -> list[tuple]:
    """Each value of an option that is read only with another (core.cli.ArgumentParser's ``requires``), given
    with that other's first accepted value: (the option, its value, (the other, its value))."""
    required = getattr(parser, "required_with", {})
    actions = {flag: action for action in parser._actions for flag in action.option_strings}
    pairs = []
    for action in parser._actions:
        if action.dest not in required:
            continue
        other = actions[required[action.dest]]
        value = next(v for v in option_values(other, names) if v is None or not is_number(other) or accepts(other, v))
        pairs += [(action, own, (other, value)) for own in option_values(action, names)]
    return pairs


def command_line(
    case: Case, base: Mapping[str, str], before: Iterable[str], after: Iterable[str], fill: Mapping[str, str]
) -> list[str]:
    """A case's command line: ``before`` (inputs, a subcommand), the options of ``base`` that the case does not
    give, the case's, ``after`` (overrides); each placeholder of ``fill`` replaced by its value."""
    given = {arg for arg in case.argv if arg.startswith("--")}
    options = [arg for option, value in base.items() if option not in given for arg in (option, value)]
    argv = [*before, *options, *case.argv, *after]
    for placeholder, value in fill.items():
        argv = [arg.replace(placeholder, value) for arg in argv]
    return argv


def run_here(cli: Any, script: str, argv: list[str]) -> subprocess.CompletedProcess:
    """``script`` run in this process (cli.here); a traceback it let through as exit -1."""
    try:
        return cli.here(script, *argv)
    except Exception as error:  # noqa: BLE001  (what the command let through: its traceback)
        return subprocess.CompletedProcess(argv, -1, "", f"Traceback: {type(error).__name__}: {error}")


def unwritable(case: Case) -> list[str]:
    """Why each path the case names for writing may not be written: inside an input run, or under a file."""
    return [
        f"{path} is {place}"
        for path in case.outputs
        for place, at in PATH_PLACES.items()
        if place != "fresh" and path.startswith(f"{at}/")
    ]
