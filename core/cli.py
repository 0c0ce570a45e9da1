"""Command-line plumbing shared by train.py, eval.py and scripts/: user errors become one line + exit 2."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, TypeVar

from core.errors import PosGPTError

F = TypeVar("F", bound=Callable)

USER_ERROR_EXIT_CODE = 2


def exit_on_user_error(fn: F) -> F:
    """Run ``fn``; a PosGPTError is printed as ``error: <message>`` and exits with code 2, no traceback.

    Ctrl-C (where the training loop does not handle it itself) exits with 130, as the shell expects, also
    without a traceback; output piped to a reader that stops early (``| head``) ends the command quietly.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PosGPTError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT_CODE)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            sys.exit(128 + signal.SIGINT)
        except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly, as Unix tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


class _Tee:
    """A text stream that also appends its complete lines to a log file (progress-bar redraws left out)."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self._stream, self._log, self._pending = stream, log, ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if "\r" not in line:  # tqdm redraws its bar after a \r: the log keeps printed lines only
                self._log.write(line + "\n")
        _, bar, last = self._pending.rpartition("\r")
        self._pending = bar + last  # only the latest redraw of a bar is kept, still marked as one
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def tee_console(path: Path) -> None:
    """From now on, append what this process prints (stdout and stderr, the final ``error:`` line included)
    to ``path`` as well: a run's console log. A second call (the next job of a multirun, in the same process)
    moves the copy to the new file."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Tee):
            stream._log.close()
            setattr(sys, name, stream._stream)
    log = open(path, "a", buffering=1)  # noqa: SIM115 (open until the process exits or the next job starts)
    sys.stdout, sys.stderr = _Tee(sys.stdout, log), _Tee(sys.stderr, log)
