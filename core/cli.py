"""Command-line plumbing shared by train.py, eval.py and scripts/: user errors become one line + exit 2."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import TypeVar

from core.errors import PosGPTError

F = TypeVar("F", bound=Callable)

USER_ERROR_EXIT_CODE = 2


def exit_on_user_error(fn: F) -> F:
    """Run ``fn``; a PosGPTError is printed as ``error: <message>`` and exits with code 2, no traceback.

    Ctrl-C (where the training loop does not handle it itself) exits with 130, as the shell expects, also
    without a traceback.
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

    return wrapper  # type: ignore[return-value]
