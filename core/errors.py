"""The exception types for what a user must fix: mistakes (bad config, missing files, broken checkpoints) and
faults of the machine (a full disk, a missing permission).

train.py and eval.py catch them at the top and print their message as a single line with a non-zero exit,
so the message must say what to change, not what went wrong internally.
"""

import errno
import sys

USER_ERROR_EXIT_CODE = 2
IO_ERROR_EXIT_CODE = 74  # EX_IOERR of sysexits.h: the command was right, the machine could not do it
# What the machine, not the command, got wrong (raised as OSError with these numbers): a MachineFault.
FAULT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO})


class PosGPTError(Exception):
    """A user-facing error: its message is shown as-is, without a traceback."""

    exit_code = USER_ERROR_EXIT_CODE


class MachineFault(PosGPTError):
    """The machine failed to read or write a file (no space left, no permission, an I/O error): shown like a
    PosGPTError, with its own exit code, so that a scheduler can tell it from a mistake in the command."""

    exit_code = IO_ERROR_EXIT_CODE


def warn(message: str) -> None:
    """One line on stderr, ``warning: <message>``: something went wrong that the run works around."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, for a one-line report of an internal error."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
