"""Ctrl-C at any moment is one line and exit 130, also while a command is still importing its libraries.

A command's ``main`` turns KeyboardInterrupt into that line (core.cli.exit_on_user_error); before it runs, a
command spends a second or more importing torch, Hydra and matplotlib, where an interrupt would print Python's
traceback through dozens of library frames. Each command imports this module first (stdlib only, so it is loaded in
milliseconds), and an interrupt that escapes everything else then ends the process the same way.

A library may swallow the KeyboardInterrupt that lands while it imports and fail later for it (numpy half
initialised, an AttributeError at its first use): the SIGINT handler installed here records that an interrupt came,
and an exception that escapes after one is that interrupt, the same one line and exit 130, not a traceback.

Imported first, it also pauses the cyclic garbage collector in a command's own process (its ``__main__`` is a file of
the repository's root or scripts/; not where a test imports a command): importing torch builds some hundred
thousand objects, and each full collection on the way walked all of them (about 0.4 s of a command's start).
core.cli.exit_on_user_error resumes it when the command's main starts, and freezes what the imports built.

A command that writes results beside others (eval.py, export, slim, compare, rebuild_reports) also calls
:func:`unwind_on_sigterm`: SIGTERM then ends it through the same unwinding as Ctrl-C, so the ``finally`` of an
atomic write removes its temporary file (core.files.atomic_write), with the shell's code for it, 143. train.py keeps
SIGTERM as the training loop and torchrun use it (training/loop.py: checkpoint and stop).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys

INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
_previous_hook = sys.excepthook
_interrupted = False  # a SIGINT has come (see the module's docstring)


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so that it unwinds (no ``except Exception`` stops it)."""


def _one_line(kind: type[BaseException], error: BaseException, traceback) -> None:
    if _interrupted and not issubclass(kind, Terminated):
        kind = KeyboardInterrupt
    if issubclass(kind, KeyboardInterrupt | Terminated):
        print("interrupted" if issubclass(kind, KeyboardInterrupt) else "terminated", file=sys.stderr, flush=True)
        os._exit(INTERRUPTED_EXIT_CODE if issubclass(kind, KeyboardInterrupt) else TERMINATED_EXIT_CODE)
    _previous_hook(kind, error, traceback)


def _interrupt(signum: int, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether a SIGINT has come in this process."""
    return _interrupted


def is_plain_ctrl_c(handler: object) -> bool:
    """Whether ``handler`` is Python's own SIGINT handler, or this module's, which raises KeyboardInterrupt as it
    does (and records it): code that takes Ctrl-C over only from those leaves a custom or ignored one alone."""
    return handler is signal.default_int_handler or handler is _interrupt


def _terminate(signum: int, frame) -> None:
    raise Terminated()


def is_command_process() -> bool:
    """Whether this process runs one of posgpt's commands: its ``__main__`` is a file of the repository's root
    (train.py, eval.py, sample.py) or of scripts/, not a program that imports one (pytest), nor a worker that
    multiprocessing started by spawning (it imports the command's file as its __main__ but never runs its main)."""
    if multiprocessing.parent_process() is not None:
        return False
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return main is not None and os.path.dirname(os.path.abspath(main)) in (root, os.path.join(root, "scripts"))


def unwind_on_sigterm() -> None:
    """From now on SIGTERM unwinds the process (Terminated) and ends it with one line, exit 143."""
    signal.signal(signal.SIGTERM, _terminate)


sys.excepthook = _one_line
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # ignored (a background job): left so
    signal.signal(signal.SIGINT, _interrupt)
if is_command_process():  # resumed by core.cli.exit_on_user_error, where the command's main starts
    gc.disable()
