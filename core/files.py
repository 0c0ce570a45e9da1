"""Files in and out of a command, each failure one line: what a user hands in, what a command writes.

- :func:`read_user_text` reads a text file the user named (a prompt file, a corpus): a file that is missing, a
  directory, unreadable or not UTF-8 (with the byte where it fails) is a PosGPTError naming the setting.
- :func:`read_json` and :func:`read_jsonl` read a results file a command wrote (a run's results document, its
  metrics log): a file cut short (a truncated document, a last line torn by a kill) or otherwise not JSON is a
  PosGPTError naming it, never read as if whole. Only a run resuming its own log drops a torn last line.
- :func:`check_outputs` refuses, before anything is written, an output that would overwrite a file the command
  reads, or another run's own files (its checkpoints, results and logs: core/rundir.py's RUN_ENTRIES);
  :func:`check_writable` one the machine will not let the command write, and :func:`check_folder` a folder a
  command or a library it calls (W&B's files, matplotlib's: :func:`check_matplotlib_folders`) would make or write
  into, so that a command plans every write before its first.
- Every write stays in the folder it is meant for (:func:`meant_folder`: the training run that holds the path,
  else the folder it is named in): each write primitive here, :func:`atomic_write`, :func:`open_append`,
  :func:`remove` and :func:`make_folder`, asks core.paths.inside, and :func:`check_outputs` asks it at plan time.
- :func:`atomic_write` writes a file whole or not at all; a full disk or a missing permission is a MachineFault
  naming the file, and the previous version of the file is left as it was.
- :func:`os_fault` turns any other failure of the machine (no space left, permission denied, an I/O error) into
  the same kind of one line, naming the file being read or written when the error happened (core.paths'
  bad_path: a path no file can have).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import FAULT_ERRNOS, MachineFault, PosGPTError, first_line
from core.paths import bad_path, inside, os_error_of, within
from core.rundir import RUN_ENTRIES, is_run_dir

TMP_PREFIX = ".tmp-"


def read_json(path: str | Path) -> Any | None:
    """The JSON document at ``path``, or None where there is none; one that is cut short, unreadable or not JSON is a
    PosGPTError that names it."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
        return json.loads(text)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as error:  # ValueError: not JSON (a truncated document), or not UTF-8
        raise PosGPTError(f"{path} is damaged or not JSON ({first_line(error)})") from None


def read_jsonl(path: str | Path, drop_torn_tail: bool = False) -> list[Any] | None:
    """The records of the JSON-lines file at ``path`` (blank lines skipped), or None where there is none. A line
    that is not JSON is a PosGPTError naming the file and the line; with ``drop_torn_tail`` a last line without its
    newline that is not JSON, as a kill mid-write leaves it, is dropped instead (a run resuming its own log)."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        raise PosGPTError(f"{path} is unreadable ({first_line(error)})") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as error:
            torn = number == len(lines)  # the last line, with no newline after it
            if torn and drop_torn_tail:
                break
            what = "its last line is cut short, as a kill mid-write leaves it" if torn else f"line {number} is not JSON"
            raise PosGPTError(f"{path} is damaged: {what} ({first_line(error)})") from None
    return records


def read_user_text(path: str | Path, setting: str) -> str:
    """The text of a file the user named in ``setting`` (newlines as text mode reads them: CRLF and CR become
    LF), or a PosGPTError saying what is wrong with it."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise PosGPTError(f"{setting}: {path} is a directory, not a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PosGPTError(f"{setting}: {path} does not exist") from None
    except OSError as e:
        raise PosGPTError(f"{setting}: cannot read {path} ({e.strerror}); fix it or drop it") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(setting, path, e.start, e.reason) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def not_utf8(setting: str, path: str | Path, offset: int, reason: str) -> PosGPTError:
    return PosGPTError(
        f"{setting}: could not read {path}: not valid UTF-8 at byte {offset} ({reason}); "
        "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8) or drop it"
    )


def first_invalid_utf8(path: str | Path) -> tuple[int, str] | None:
    """The byte offset and reason where ``path`` stops being UTF-8, or None if it is UTF-8 (or unreadable)."""
    try:
        Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start, e.reason
    except OSError:
        pass
    return None


def meant_folder(path: str | Path) -> Path:
    """The folder a write to ``path`` is meant for: the outermost training run directory on the path as it is named
    (so that a link inside a run to another run is not taken for the run), else the folder it is named in."""
    path = Path(path).expanduser().absolute()
    for parent in reversed(path.parents[:-1]):  # the root itself is never a run
        if is_run_dir(parent):
            return parent
    return path.parent


def _confined(folder: str | Path | None, path: str | Path) -> Path:
    """:func:`core.paths.inside` of ``folder``, by default the folder ``path`` is meant for (:func:`meant_folder`)."""
    return inside(meant_folder(path) if folder is None else folder, path)


def open_append(path: str | Path, folder: str | Path | None = None) -> io.TextIOWrapper:
    """``path`` opened to append text, line-buffered (a log), after :func:`inside`; never through a link."""
    path = _confined(folder, path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    return open(fd, "a", buffering=1)  # noqa: SIM115 (the caller closes it)


def remove(path: str | Path, folder: str | Path | None = None) -> None:
    """Delete the file ``path`` (nothing where there is none) after :func:`inside` of its folder: a link is removed
    itself, never what it points to, and a linked folder on the way out of ``folder`` is refused."""
    path = Path(path).expanduser().absolute()
    _confined(folder, path.parent)
    path.unlink(missing_ok=True)


def make_folder(path: str | Path, folder: str | Path | None = None) -> Path:
    """Make the folder ``path`` and its parents after :func:`inside`: never through a link out of ``folder``."""
    path = _confined(folder, path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _same_file(a: Path, b: Path) -> bool:
    """The same path, or two names of one file (a symbolic or hard link, as step_N.pt is to last.pt)."""
    with contextlib.suppress(OSError):
        return a == b or (a.exists() and b.exists() and os.path.samefile(a, b))
    return False


def _run_entry(path: Path) -> tuple[Path, str] | None:
    """(run directory, entry) if ``path`` is or lies in one of a training run's own entries (RUN_ENTRIES)."""
    for parent in path.parents:
        entry = path.relative_to(parent).parts[0]
        if entry in RUN_ENTRIES and is_run_dir(parent):
            return parent, entry
    return None


def check_outputs(
    outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path] = (), run: str | Path | None = None
) -> None:
    """Refuse (PosGPTError, before anything is written) an output, named by the option that chose it, that

    - is one of ``inputs`` (files or folders the command reads), holds one (an output folder), or is an existing
      file inside an input folder;
    - lies in a training run's own files (RUN_ENTRIES: checkpoints/, eval/, logs, .hydra/), other than those of
      ``run``, the run this command writes (and holds the lock of, core.rundir.lock_run), or anywhere in a training
      run among ``inputs`` other than ``run`` (an export of a run into itself, a table written into a run it reads);
    - is an existing directory, lies under a file, or is the path of another of the outputs;
    - leads out of the folder it is meant for through a link (:func:`inside`).
    """
    sources = [Path(p).expanduser().absolute().resolve() for p in inputs]
    own = Path(run).absolute().resolve() if run is not None else None
    seen: dict[Path, str] = {}
    for option, given in outputs.items():
        if given is None:
            continue
        in_run = run is not None and within(Path(given).expanduser().absolute(), Path(run).absolute())
        _confined(run if in_run else None, given)
        path = Path(given).expanduser().absolute().resolve()
        shown = f"{option} {given}"
        if path in seen:
            raise PosGPTError(f"{seen[path]} and {shown} are the same file: give each output its own path")
        seen[path] = shown
        for source in sources:
            if _same_file(path, source) or within(source, path) or (path.exists() and within(path, source)):
                raise PosGPTError(
                    f"{shown} would overwrite {source}, which this command reads: choose another path "
                    "(nothing was written)"
                )
            if source != own and within(path, source) and is_run_dir(source):
                raise PosGPTError(
                    f"{shown} lies in the training run {source}, which this command reads and only that run's own "
                    "commands write: choose a path outside it (nothing was written)"
                )
        if path.is_dir():
            raise PosGPTError(f"{shown} is a directory: give a file path")
        blocking = next((parent for parent in path.parents if parent.exists() and not parent.is_dir()), None)
        if blocking is not None:
            raise PosGPTError(f"{shown} lies under {blocking}, which is a file, not a folder (nothing was written)")
        owner = _run_entry(path)
        if owner is not None and owner[0] != own:
            raise PosGPTError(
                f"{shown} lies in {owner[1]} of the training run {owner[0]}, which only that run's own commands "
                "write: choose a path outside it (nothing was written)"
            )


def _deepest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else its deepest existing parent (the root always exists)."""
    return next(folder for folder in (path, *path.parents) if folder.exists())


def _why_not_writable(path: Path, mode: int) -> str | None:
    """Why this process may not write ``path`` (os.access with ``mode``: a read-only file system, a missing
    permission), or None where it may. os.access asks the kernel with the process's real ids, as the write will."""
    if os.access(path, mode):
        return None
    read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    return os.strerror(errno.EROFS if read_only else errno.EACCES)


def check_folder(shown: str, folder: str | Path) -> None:
    """Refuse, before anything is written, a folder that a write would make or fill (``shown`` names the setting
    that chose it) where it cannot be: a file stands at its path or above it (PosGPTError, a mistake in the
    command), or the deepest existing folder on its path is one this process may not create entries in
    (MachineFault, as the write itself would be)."""
    folder = Path(folder).expanduser().absolute()
    existing = _deepest_existing(folder)
    if not existing.is_dir():
        where = "is a file" if existing == folder else f"lies under {existing}, which is a file"
        raise PosGPTError(f"{shown} {folder} {where}, not a folder: move the file away (nothing was written)")
    why = _why_not_writable(existing, os.W_OK | os.X_OK)
    if why is not None:
        raise MachineFault(f"{shown}: cannot write in {existing}: {why} (nothing was written)")


def check_matplotlib_folders() -> None:
    """Refuse (as :func:`check_folder`) the folders matplotlib would keep its settings and font cache in, before it
    is first imported: MPLCONFIGDIR, else on Linux $XDG_CONFIG_HOME/matplotlib and $XDG_CACHE_HOME/matplotlib
    (~/.config, ~/.cache), as matplotlib chooses them. Where it cannot write there, matplotlib makes a temporary
    folder and prints two lines of its own, beside the command's one. Once matplotlib is imported it has chosen."""
    if "matplotlib" in sys.modules or not (os.environ.get("MPLCONFIGDIR") or sys.platform.startswith("linux")):
        return
    if os.environ.get("MPLCONFIGDIR"):
        folders = [Path(os.environ["MPLCONFIGDIR"])]
    else:
        bases = [os.environ.get("XDG_CONFIG_HOME") or "~/.config", os.environ.get("XDG_CACHE_HOME") or "~/.cache"]
        folders = [Path(base).expanduser() / "matplotlib" for base in bases]
    for folder in folders:
        check_folder("matplotlib's folder (MPLCONFIGDIR chooses another)", folder)


def check_writable(outputs: Mapping[str, str | Path | None]) -> None:
    """Refuse, before anything is written, an output (named by the option that chose it) that this process could
    not write: its folder as :func:`check_folder` checks it, and an existing file there that it may not replace.
    With :func:`check_outputs`, which says whether the path is one to write at all, every output of a command is
    known to be writable before the first is written."""
    for option, given in outputs.items():
        if given is None:
            continue
        path = Path(given).expanduser().absolute()
        check_folder(f"{option} {given}: the folder", path.parent)
        why = _why_not_writable(path, os.W_OK) if path.exists() else None
        if why is not None:
            raise MachineFault(f"{option} {given}: cannot write it: {why} (nothing was written)")


def write_fault(path: str | Path, error: OSError) -> MachineFault:
    return MachineFault(f"could not write {path}: {error.strerror or error}")


def atomic_write(
    path: str | Path, content: str | bytes | Callable[[BinaryIO], object], folder: str | Path | None = None
) -> Path:
    """Write ``content`` (text, bytes, or a function writing into the open binary file) to ``path`` whole or
    not at all, inside ``folder`` (:func:`inside`): into a temporary file beside it, fsync, rename over ``path``
    (a link there is replaced, never written through), fsync the directory.

    A crash or kill -9 mid-write leaves the previous file intact (and a temporary file named TMP_PREFIX...);
    a full disk or a missing permission too, and is a MachineFault naming ``path``.
    """
    path = _confined(folder, path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "wb") as f:
                if callable(content):
                    content(f)
                else:
                    f.write(content.encode() if isinstance(content, str) else content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # makes the rename itself durable
        finally:
            os.close(directory)
    except (OSError, RuntimeError) as error:
        cause = os_error_of(error)
        if cause is None:
            raise
        raise (bad_path(cause) or write_fault(path, cause)) from None  # a loop of links is the command's mistake
    return path


def open_file_in(error: BaseException) -> io.IOBase | None:
    """The file that was open where ``error`` was raised (the innermost frame holding one), if any: it says which
    file a failure of the machine was about when the OSError does not."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str):
                if not value.name.startswith("<"):  # <stdout>, <stderr>
                    return value
    return None


def os_fault(error: OSError) -> MachineFault | None:
    """A failure of the machine (FAULT_ERRNOS) as one line naming its file; None for other OSErrors."""
    if error.errno not in FAULT_ERRNOS:
        return None
    if error.filename:
        return MachineFault(f"{error.strerror}: {error.filename}")
    file = open_file_in(error)
    if file is None:
        return MachineFault(f"{error.strerror} (while reading or writing a file)")
    writing = any(flag in getattr(file, "mode", "") for flag in "wax+")
    return MachineFault(f"could not {'write' if writing else 'read'} {file.name}: {error.strerror}")
