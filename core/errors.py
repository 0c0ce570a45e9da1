"""The one exception type for mistakes a user can make (bad config, missing files, broken checkpoints).

train.py and eval.py catch it at the top and print its message as a single line with a non-zero exit,
so the message must say what to change, not what went wrong internally.
"""


class PosGPTError(Exception):
    """A user-facing error: its message is shown as-is, without a traceback."""
