"""Whose fault, and which file: a path through a loop of symbolic links is a mistake in the command (one line,
exit 2) wherever a command first meets it, also where ``Path.resolve()`` reports it as a RuntimeError (Python
< 3.13); a run directory the machine will not let a command write (read-only, no permission, a full disk) is the
machine's fault (one line naming the file, exit 74), and leaves no lock file behind. Through the command lines, in
this process; the machine's faults are simulated where the file is opened or written (tests may run as root, whom
permissions do not stop)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
from cli_runs import assert_one_line_error, evaluated_run
from tiny_checkpoint import make_run

import core.files
from core.errors import IO_ERROR_EXIT_CODE, MachineFault, PosGPTError
from core.files import atomic_write
from core.paths import path_loop
from core.rundir import LOCK_FILE

LOOP_MESSAGE = "Too many levels of symbolic links"


def snapshot(directory: Path) -> dict:
    return {path.relative_to(directory): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def evaluated(cli, tmp_path_factory) -> Path:
    """A run with results (a checkpoint of untrained weights, evaluated at one length): read it, never write it."""
    return evaluated_run(cli, tmp_path_factory.mktemp("evaluated"))


@pytest.fixture
def loop(tmp_path) -> Path:
    """A symbolic link in a loop of two: no path through it resolves."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a"


EVAL = ("eval.lengths=[16]", "eval.protocols=[nonoverlapping]")
LOOP_CASES = {
    "compare --markdown": lambda run, loop: ("scripts/compare.py", str(run), "--markdown", f"{loop}/c.md"),
    "export --to": lambda run, loop: ("scripts/export_results.py", str(run), "--to", str(loop)),
    "export a run": lambda run, loop: ("scripts/export_results.py", str(loop), "--to", str(run.parent / "out")),
    "eval run_dir": lambda run, loop: ("eval.py", f"run_dir={loop}"),
    "sample run_dir": lambda run, loop: ("sample.py", f"run_dir={loop}"),
    "eval data.files": lambda run, loop: ("eval.py", f"run_dir={run}", "data=text", f"data.files=[{loop}]", *EVAL),
}


@pytest.mark.parametrize("case", LOOP_CASES.values(), ids=LOOP_CASES.keys())
def test_a_path_through_a_loop_of_links_is_one_line_exit_2(cli, evaluated, loop, case):
    before = snapshot(evaluated)
    done = cli.here(*case(evaluated, loop))
    assert_one_line_error(done, LOOP_MESSAGE, str(loop))
    assert snapshot(evaluated) == before and not (evaluated.parent / "out").exists()


def test_a_token_cache_behind_a_loop_of_links_is_refused_at_start_up(cli, loop, tmp_path):
    """Not exit 74 ("cannot write the token cache") once the run directory is made: a mistake in the command."""
    run_dir = tmp_path / "run"
    done = cli.train_here(run_dir, f"data.cache_dir={loop}")
    assert_one_line_error(done, f"data.cache_dir (or $POSGPT_CACHE_DIR) {loop}", LOOP_MESSAGE)
    assert not run_dir.exists()


def test_pathlibs_loop_error_is_read_on_every_supported_python():
    newer = RuntimeError("Symlink loop from '/x/y'")  # 3.11, 3.12: raised while handling stat's ELOOP
    newer.__context__ = OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/x/y")
    assert path_loop(newer) is newer.__context__
    older = path_loop(RuntimeError("Symlink loop from '/x/y'"))  # 3.10: pathlib counts the links itself
    assert (older.errno, older.filename) == (errno.ELOOP, "/x/y")
    assert path_loop(RuntimeError("something else")) is None


def test_a_write_through_a_loop_of_links_is_the_commands_mistake(loop):
    with pytest.raises(PosGPTError, match=LOOP_MESSAGE) as refused:
        atomic_write(loop / "results.json", "{}")
    assert not isinstance(refused.value, MachineFault)


def refuse_lock(code: int):
    """os.open, except that opening a lock file fails with ``code`` (a read-only file system, no permission)."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if str(path).endswith(LOCK_FILE):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)

    return fake_open


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["read-only", "no permission"])
@pytest.mark.parametrize("command", ["eval.py", "train.py"])
def test_a_run_directory_the_machine_will_not_let_us_write_is_exit_74(
    cli, evaluated, tmp_path, monkeypatch, code, command
):
    monkeypatch.setattr(os, "open", refuse_lock(code))
    before = snapshot(evaluated)
    if command == "eval.py":
        done = cli.eval_here(evaluated, *EVAL)
    else:  # a fresh run into a folder that exists: its lock is the first thing it writes there
        (tmp_path / "existing").mkdir()
        done = cli.train_here(tmp_path / "existing")
        assert list((tmp_path / "existing").iterdir()) == []
    assert done.returncode == IO_ERROR_EXIT_CODE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot lock the run directory" in lines[0] and LOCK_FILE in lines[0], done.stderr
    assert os.strerror(code) in lines[0]
    assert snapshot(evaluated) == before


def fill_lock_file(monkeypatch) -> None:
    """os.write to a lock file fails as on a full disk (its open succeeds: creating a file takes no block)."""
    real_write = os.write

    def fake_write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(LOCK_FILE):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", fake_write)


class FullDisk(io.FileIO):
    """A file on a disk with no room left."""

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["lock file", "results"])
def test_a_full_disk_during_evaluation_names_the_file_and_leaves_no_lock(cli, evaluated, tmp_path, monkeypatch, where):
    run_dir = tmp_path / "run"
    make_run(run_dir, cli.corpus)
    if where == "lock file":
        fill_lock_file(monkeypatch)
        named = run_dir / LOCK_FILE
    else:
        monkeypatch.setattr(core.files, "open", lambda path, mode: FullDisk(path, "w"), raising=False)
        named = run_dir / "eval" / "extrapolation.json"
    done = cli.eval_here(run_dir, *EVAL)
    assert done.returncode == IO_ERROR_EXIT_CODE, done.stderr
    assert done.stderr.strip() == f"error: could not write {named}: {os.strerror(errno.ENOSPC)}"
    assert not (run_dir / LOCK_FILE).exists()
