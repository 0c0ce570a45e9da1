"""core/interrupts.py's pause of the cyclic collector: only in a command's own process, which its ``__main__`` tells
apart from a program that imports a command (the one-line Ctrl-C is tested through the commands, tests/commands/)."""

from core.interrupts import is_command_process

import sys
import types

import pytest
from repo_root import REPO


@pytest.mark.parametrize(
    "main_file, command",
    [
        (REPO / "train.py", True),
        (REPO / "eval.py", True),
        (REPO / "scripts" / "compare.py", True),
        (REPO / "tests" / "support" / "fla_interpreted.py", False),
        (REPO.parent / "train.py", False),
        (None, False),  # python -c, an interactive session
    ],
)
def test_a_command_is_told_apart_by_the_file_its_main_module_runs(main_file, command, monkeypatch):
    main = types.ModuleType("__main__")
    if main_file is not None:
        main.__file__ = str(main_file)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert is_command_process() is command


def test_this_test_process_is_not_a_command_and_keeps_its_collector():
    assert not is_command_process()
    import gc

    assert gc.isenabled()


def test_a_worker_spawned_by_multiprocessing_is_not_the_command(monkeypatch):
    """A spawned worker (DataLoader's, the tokenizer's, where spawning is the default) imports the command's file as
    its __main__ and never runs its main, which would resume the collector."""
    import multiprocessing

    main = types.ModuleType("__main__")
    main.__file__ = str(REPO / "train.py")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert not is_command_process()
