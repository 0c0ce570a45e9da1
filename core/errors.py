"""The one exception type for mistakes a user can make (bad config, missing files, broken checkpoints).

train.py and eval.py catch it at the top and print its message as a single line with a non-zero exit,
so the message must say what to change, not what went wrong internally.
"""

import sys


class PosGPTError(Exception):
    """A user-facing error: its message is shown as-is, without a traceback."""


def warn(message: str) -> None:
    """One line on stderr, ``warning: <message>``: something went wrong that the run works around."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, for a one-line report of an internal error."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
