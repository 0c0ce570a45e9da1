"""Paths: whether a path stays inside a folder once its links are followed, and a path no file can have.

- :func:`inside` is the one check that keeps a write in the folder it is meant for: a path that a link (a file or a
  folder on the way) takes out of the folder is refused in one line, before anything is written. core.files' write
  primitives and core.rundir's lock and entry check ask it.
- :func:`bad_path` turns a path no file can have (too long, a loop of links) into one line, as a mistake in the
  command; :func:`path_loop` finds the loop in pathlib's RuntimeError, which ``Path.resolve()`` raises for it
  before Python 3.13.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from core.errors import PosGPTError

# What a path the user typed got wrong, wherever the command first touches it.
BAD_PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP})


def within(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies in it, as named (no link is followed)."""
    return path == folder or folder in path.parents


def inside(folder: str | Path, path: str | Path) -> Path:
    """``path`` (absolute) if, with every link on it followed, the last one included, it lies in ``folder``; else a
    PosGPTError naming the link's target, before anything is written. So a link planted in a run directory or an
    export (a file, or a folder such as ``eval/``) never takes a write, a lock or a deletion out of it."""
    path = Path(path).expanduser().absolute()
    folder = Path(folder).expanduser().absolute()
    try:
        real, real_folder = path.resolve(), folder.resolve()
    except (OSError, RuntimeError) as error:  # a loop of links: a path no file can have
        cause = path_loop(error) if isinstance(error, RuntimeError) else error
        if cause is None or bad_path(cause) is None:
            raise
        raise bad_path(cause) from None
    if not within(real, real_folder):
        raise PosGPTError(
            f"{path} leads out of {folder} through a link (to {real}): remove the link; a command writes only "
            "inside the folder it is meant for (nothing was written)"
        )
    return path


def bad_path(error: OSError) -> PosGPTError | None:
    """A path the user named that no file can have (BAD_PATH_ERRNOS: too long, a loop of links) as one line naming
    it (its start, if it is long); None for other OSErrors."""
    if error.errno not in BAD_PATH_ERRNOS:
        return None
    name = str(error.filename or "")
    shown = name if len(name) <= 100 else f"{name[:80]}... ({len(name)} characters)"
    return PosGPTError(f"{error.strerror}: {shown}; check the paths in the command")


def path_loop(error: RuntimeError) -> OSError | None:
    """pathlib's RuntimeError for a loop of symbolic links (``Path.resolve()`` before Python 3.13 raises it where
    the system says ELOOP) as that OSError, so that :func:`bad_path` reads it as a path no file can have; None for
    any other RuntimeError."""
    cause = os_error_of(error)  # 3.11, 3.12: raised while handling stat's ELOOP
    if cause is not None and cause.errno == errno.ELOOP:
        return cause
    found = re.fullmatch(r"Symlink loop from (.*)", str(error))  # 3.10: pathlib counts the links itself
    if found is None:
        return None
    return OSError(errno.ELOOP, os.strerror(errno.ELOOP), found.group(1).strip("'\""))


def os_error_of(error: BaseException) -> OSError | None:
    """The OSError at the root of ``error`` (torch.save reports a failed write as a RuntimeError raised while
    handling the OSError), or None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
