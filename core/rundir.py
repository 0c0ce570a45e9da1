"""A run directory: what in it belongs to the run, one command at a time writing it, and no trace of a refused one.

A run directory (``hydra.run.dir``) holds the run's own files, ``RUN_ENTRIES``: its checkpoints, its results
(``eval/``), its logs, its record of how it was started (``.hydra/``), its W&B files and, while a command
writes the run, the lock file. Only one command at a time may write a run (train.py, eval.py,
scripts/inspect_attention.py): each holds :func:`lock_run` for its whole life, and a second one is refused,
naming the holder. The lock is the operating system's (``flock``): it is released when its holder ends, even
by kill -9, so a stopped run can always be resumed. A command that ends normally also removes the lock file,
so a command that did nothing leaves the directory as it found it. A command that has a run changed by another
process (scripts/check_below_length.py runs eval.py on each) asks :func:`refuse_if_live` of every run first.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shlex
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from core.errors import FAULT_ERRNOS, MachineFault, PosGPTError
from core.paths import inside

LOCK_FILE = ".posgpt.lock"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
EVAL_DIR = "eval"
CONSOLE_LOG = "train.log"
RUN_RECORD_DIR = ".hydra"  # where Hydra would write it; configs/config.yaml stops Hydra writing there itself
WANDB_DIR = "wandb"
# What a run writes into its directory: no other command may write there (core/files.py, check_outputs).
RUN_ENTRIES = (CHECKPOINT_DIR, EVAL_DIR, RUN_RECORD_DIR, METRICS_FILE, CONSOLE_LOG, WANDB_DIR, LOCK_FILE)
# Entries only a training run makes: a folder with one of them is a run (an exported copy of results is not).
RUN_MARKERS = (CHECKPOINT_DIR, RUN_RECORD_DIR, CONSOLE_LOG, LOCK_FILE)

_EXISTING: Path | None = None  # the deepest directory that existed above the run directory: see note_existing
_HELD: dict[int, Path] = {}  # file descriptor -> lock file, of the locks this process holds


def _close_in_child() -> None:
    """A forked child (a tokenizer worker) must not keep its parent's lock alive after the parent dies:
    flock belongs to the open file, which fork shares. Closing the child's copy leaves the parent's lock as it is."""
    for fd in _HELD:
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a training run's directory (not an exported copy of its results)."""
    return any((path / marker).exists() for marker in RUN_MARKERS)


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (it writes once it holds the lock)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 1 << 16).decode())
        command = info["command"] if len(info["command"]) <= 100 else info["command"][:97] + "..."
        return f"{command} (pid {info['pid']} on {info['host']}, started {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):  # the holder has not written it yet
        return "another command"


def _write_holder(fd: int, path: Path) -> None:
    """Write who holds the lock into the lock file; a full disk stops the command here, naming the file, before any
    work whose results it could not write."""
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]).replace("\n", " "),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode())
    except OSError as error:
        raise MachineFault(f"could not write {path}: {error.strerror}") from None


def _in_use(run_dir: Path, holder: str) -> PosGPTError:
    return PosGPTError(
        f"{run_dir} is in use by {holder}: one command at a time may write a run directory; wait for it "
        "to end, or choose another directory"
    )


def refuse_if_live(run_dir: str | Path) -> None:
    """Refuse (PosGPTError naming the holder) a run whose lock another command holds, without taking the lock and
    without writing: a shared flock on its lock file, where there is one, released at once. A lock file left by a
    holder that was killed is free, and stays as it is. A lock path that is not a file is refused as lock_run
    would refuse it. For the instant the shared lock is held, a command starting on the run would be refused as
    if another command wrote it: a command asks this once, before its work."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_FILE
    if not path.exists() and not path.is_symlink():  # a holder keeps its lock file until it has let go of the lock
        return
    if path.is_symlink() or not path.is_file():
        raise _not_a_lock(run_dir, path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, _holder(fd)) from None
    finally:
        os.close(fd)  # closing the file lets go of the shared lock


def check_entries_inside(run_dir: Path) -> None:
    """Refuse (core.paths.inside), before a command that writes the run has written anything, a link among the run's
    own entries (RUN_ENTRIES) or the files in its folders that leads out of the run: every write a command makes
    into a run lands in one of them. Inside ``wandb/`` only W&B writes, and it links its own debug logs to its
    cache by design: that folder is checked itself, not its files."""
    for entry in RUN_ENTRIES:
        path = run_dir / entry
        inside(run_dir, path)
        if path.is_dir() and not path.is_symlink() and entry != WANDB_DIR:  # W&B links its logs to its own cache
            for child in path.rglob("*"):
                inside(run_dir, child)


def _not_a_lock(run_dir: Path, path: Path) -> PosGPTError:
    what = "a link" if path.is_symlink() else "not a file"
    return PosGPTError(f"cannot lock the run directory {run_dir}: {path} is {what}; remove it (nothing was written)")


@contextlib.contextmanager
def lock_run(run_dir: str | Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock while the block runs; PosGPTError naming the holder if another command holds it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PosGPTError(f"run directory {run_dir} does not exist" + (" (it is a file)" if run_dir.exists() else ""))
    path = run_dir / LOCK_FILE
    check_entries_inside(run_dir)
    while True:
        if path.is_symlink():  # a planted link: the lock record would be written into what it points to
            raise _not_a_lock(run_dir, path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:  # a read-only or full file system, a missing permission: the machine's fault
            fault = MachineFault if error.errno in FAULT_ERRNOS else PosGPTError
            raise fault(f"cannot lock the run directory {run_dir}: {error.strerror} ({path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _in_use(run_dir, holder) from None
        try:  # the previous holder may have removed the file between our open and our lock: lock the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    _HELD[fd] = path
    try:  # from here on the lock file goes with the command, also when the disk is too full to say who holds it
        _write_holder(fd, path)
        yield
    finally:
        del _HELD[fd]
        path.unlink(missing_ok=True)  # while still holding it: a waiting command then locks a file of its own
        os.close(fd)


def note_existing(path: str | Path) -> None:
    """Before the directory ``path`` is made (Hydra's callback, experiment/compose.py): remember its deepest
    existing parent, so that what is made below it is known to be this command's (removed_if_unused)."""
    global _EXISTING
    _EXISTING = next(
        directory for directory in (Path(path).absolute(), *Path(path).absolute().parents) if _exists(directory)
    )


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; False for a path no file can have (a name too long), which the command then refuses
    in its own one line. Raised here, in Hydra's callback, it became a UserWarning printed beside that line."""
    try:
        return path.exists()
    except OSError:
        return False


def _new_dirs(path: Path) -> list[Path]:
    """``path`` and its parents that did not exist before this command made them (note_existing), innermost first."""
    path = Path(path).absolute()
    if _EXISTING is None or _EXISTING not in path.parents:
        return []
    return [path, *(parent for parent in path.parents if _EXISTING in parent.parents)]


@contextlib.contextmanager
def removed_if_unused(path: str | Path) -> Iterator[None]:
    """Remove ``path`` (and its empty parents) after the block if this command made it and left it empty: a
    refused command leaves no empty run directory behind."""
    created = _new_dirs(path)
    try:
        yield
    finally:
        for directory in created:
            try:
                directory.rmdir()  # only ever removes an empty directory
            except OSError:  # something was written there after all, or another process removed it
                break
