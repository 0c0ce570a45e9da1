"""Command-line plumbing shared by train.py, eval.py and scripts/: user errors become one line + exit 2, faults
of the machine (a full disk, a missing permission) one line + exit 74."""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import os
import signal
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar

from core.config_keys import overridden_keys
from core.errors import MachineFault, PosGPTError, first_line
from core.files import open_append, os_fault
from core.paths import bad_path, path_loop
from core.text import printable

F = TypeVar("F", bound=Callable)


_LESS_MEMORY = "lower the batch, the lengths or the model's sizes"


def exit_on_user_error(fn: F) -> F:
    """Run ``fn``; a PosGPTError is printed as ``error: <message>`` and exits with its code (2; 74 for a
    MachineFault), no traceback. So is an OSError that is a fault of the machine (core.files.os_fault: no space
    left, permission denied, an I/O error), naming its file, and one about a path no file can have (too long, a
    loop of links: core.files.bad_path, exit 2), also where pathlib reports the loop as a RuntimeError
    (core.files.path_loop): every check of an input or output path resolves it, so this one place covers them.
    Running out of memory (torch's allocators, Python's MemoryError) is one line too, exit 74.

    Ctrl-C (where the training loop does not handle it itself) exits with 130, as the shell expects, also
    without a traceback; output piped to a reader that stops early (``| head``) ends the command quietly.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if fn.__module__ == "__main__":
            _freeze_what_the_imports_built()
        try:
            return fn(*args, **kwargs)
        except PosGPTError as error:
            _exit_with(error)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            sys.exit(128 + signal.SIGINT)
        except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly, as Unix tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail
            sys.exit(1)
        except OSError as error:
            fault = os_fault(error) or bad_path(error)
            if fault is None:
                raise
            _exit_with(fault)
        except MemoryError:
            _exit_with(MachineFault(f"out of memory; {_LESS_MEMORY}"))
        except RuntimeError as error:
            if type(error).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(error):  # torch's
                _exit_with(MachineFault(f"out of memory ({first_line(error)}); {_LESS_MEMORY}"))
            loop = path_loop(error)
            if loop is None:
                raise
            _exit_with(bad_path(loop))

    return wrapper  # type: ignore[return-value]


def _freeze_what_the_imports_built() -> None:
    """In a command's own process (not where a test imports its main): what its imports built (torch's modules,
    some hundred thousand objects) lives to the end, so the cyclic garbage collector is told to leave it out of
    every later collection (gc.freeze), the interpreter's last one at exit too, which otherwise took about half
    a second after importing torch; then the collector, paused while the imports ran (core.interrupts), resumes.
    Reference counting still frees whatever of it is dropped."""
    gc.freeze()
    gc.enable()


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store`` for an option that takes a value, refusing it given twice (under any of its names or
    abbreviations): argparse keeps the last value and drops the first without a word."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        if option_string is not None:
            given = parser.given_options
            if self.dest in given:
                parser.error(f"{self.option_strings[-1]} is given twice ({given[self.dest]}, {values}): give it once")
            given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose mistakes (an unknown option, a value of the wrong type, a missing argument, an option
    given twice) are PosGPTErrors: under :func:`exit_on_user_error`, one line and exit code 2 like every other
    mistake, instead of argparse's usage block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in (None, "store"):  # argparse's default action, and its name
            self.register("action", name, _StoreOnce)
        self.required_with: dict[str, str] = {}  # an option's destination -> the option that must be given for it
        self.settings_read_with: dict[str, tuple[str, ...]] = {}  # an option's destination -> the settings it reads
        self.given_options: dict[str, Any] = {}  # an option's destination -> its value, in the parse under way

    def add_argument(
        self, *args: Any, requires: str | None = None, reads: tuple[str, ...] = (), **kwargs: Any
    ) -> argparse.Action:
        """argparse's, and ``requires``: the option (its flag) that reads this one, which must be given with it:
        given alone, this one is refused, naming that option, instead of being accepted and never read. ``reads``:
        the config settings (dotted keys) that the script reads only with this option; one given among the
        overrides (``key=value``) without it is refused so."""
        action = super().add_argument(*args, **kwargs)
        if requires is not None:
            self.required_with[action.dest] = requires
        if reads:
            self.settings_read_with[action.dest] = reads
        return action

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        if namespace is None:  # a parse of its own (parse_intermixed_args' second pass continues the first's)
            self.given_options = {}
        parsed, rest = super().parse_known_args(args, namespace)
        for dest, flag in self.required_with.items():
            action = next(a for a in self._actions if a.dest == dest)
            other = next(a for a in self._actions if flag in a.option_strings)
            given = getattr(parsed, dest) != action.default
            if given and getattr(parsed, other.dest) == other.default:
                self.error(f"{action.option_strings[-1]} is read only with {flag}: give {flag} or drop it")
        given_keys = _override_keys([arg for arg in rest if not arg.startswith("-")])
        for dest, settings in self.settings_read_with.items():
            action = next(a for a in self._actions if a.dest == dest)
            unread = [key for key in given_keys if key in settings]
            if unread and getattr(parsed, dest) == action.default:
                flag = action.option_strings[-1]
                self.error(f"{unread[0]} is read only with {flag}: give {flag} or drop {unread[0]}")
        return parsed, rest

    def error(self, message: str) -> typing.NoReturn:
        raise PosGPTError(f"{message} (see {self.prog} --help)")


def _override_keys(args: list[str]) -> list[str]:
    """The keys of those of ``args`` that are Hydra overrides; the rest (a folder whose name holds '=', a word) is
    not one, and what reads the command line refuses it if it must."""
    keys = []
    for arg in args:
        with contextlib.suppress(PosGPTError):
            keys += overridden_keys([arg])
    return keys


def count(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number >= ``minimum``, so that a script option declares its domain where it is
    declared (a zero or negative length would print a negative memory or skip the measurement, and exit 0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is out of its domain [{minimum}, inf)")
        return value

    parse.__name__ = f"whole number >= {minimum}"  # argparse names the type so in its messages
    parse.minimum = minimum  # the domain's edge, declared with it (what draws values at the edge reads it)
    return parse


def _exit_with(error: PosGPTError) -> None:
    print(f"error: {printable(str(error))}", file=sys.stderr, flush=True)  # one line, whatever a path in it holds
    sys.exit(error.exit_code)


class _Tee:
    """A text stream that also appends its complete lines to a log file (progress-bar redraws left out)."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self._stream, self._log, self._pending = stream, log, ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        _, bar, last = self._pending.rpartition("\r")
        self._pending = bar + last  # only the latest redraw of a bar is kept, still marked as one
        try:
            for line in lines:
                if "\r" not in line:  # tqdm redraws its bar after a \r: the log keeps printed lines only
                    self._log.write(line + "\n")
        except OSError as error:  # a full disk: stop here, and say so on the console alone
            _untee()
            raise MachineFault(f"could not write {self._log.name}: {error.strerror}") from None
        return written

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _untee() -> None:
    """Back to the console alone."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            with contextlib.suppress(OSError):  # a full disk may refuse the last buffered bytes
                stream._log.close()
            setattr(sys, name, stream._stream)


@contextlib.contextmanager
def kept_console() -> Iterator[io.StringIO]:
    """Print as usual and keep a copy of the printed lines: what a command says before its checks have passed,
    for :func:`tee_console` to put at the head of the run's log once it may write there."""
    _untee()  # the last job's log (a multirun's) takes nothing of the next job
    kept = io.StringIO()
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(sys.stdout, kept), _Tee(sys.stderr, kept)
    try:
        yield kept
    finally:
        sys.stdout, sys.stderr = streams


def tee_console(path: Path, earlier: str = "") -> None:
    """From now on, append what this process prints (stdout and stderr, the final ``error:`` line included)
    to ``path`` as well, after ``earlier`` (:func:`kept_console`): a run's console log. A second call (the next
    job of a multirun, in the same process) moves the copy to the new file."""
    _untee()
    log = open_append(path)  # open until the process exits or the next job starts
    log.write(earlier)
    sys.stdout, sys.stderr = _Tee(sys.stdout, log), _Tee(sys.stderr, log)
