"""Faults of the machine are one line and lose nothing; every file a user hands in fails in one line.

A full disk or a missing permission while writing a checkpoint, results or the token cache is one line naming
the file (exit 74, core.errors.MachineFault), and the previous file is left whole. The full disk is made
deterministic: in-process, the file's write raises ENOSPC; through train.py, a file-size limit (RLIMIT_FSIZE)
makes the checkpoint's write fail with EFBIG. A permission error is simulated the same way (tests may run as
root, whom chmod does not stop). A prompt file, a Hydra config file or a checkpoint that is not what it should
be (not UTF-8, not YAML, garbage, a directory) is one line too.
"""

import errno
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys

import pytest
import torch
from cli_runs import REPO, STEPS, TIMEOUT_S, assert_one_line_error, assert_user_error, reference_run

import core.files
from core import cli as core_cli
from core.checkpoint_io import load_checkpoint, save_checkpoint
from core.errors import IO_ERROR_EXIT_CODE, MachineFault, PosGPTError
from core.files import TMP_PREFIX, read_user_text
from core.rundir import RUN_MARKERS
from data import load_splits
from data.config import DataConfig
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.store import write_document


class FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: the write after that raises ENOSPC (or ``error``)."""

    def __init__(self, path, room: int, error: int = errno.ENOSPC) -> None:
        super().__init__(path, "w")
        self.room, self.error = room, error

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(self.error, os.strerror(self.error))
        self.room -= len(data)
        return super().write(data)


@pytest.fixture
def full_disk(monkeypatch):
    """Every file core.files.atomic_write opens from now on is on a full disk (a little room left)."""
    monkeypatch.setattr(core.files, "open", lambda path, mode: FullDisk(path, room=100), raising=False)


@pytest.fixture
def no_permission(monkeypatch):
    def refuse(path, mode):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(core.files, "open", refuse, raising=False)


def state(step: int) -> dict:
    return {"model": {"w": torch.randn(1000)}, "step": step, "config": {}}


@pytest.mark.parametrize("fault, message", [("full_disk", "No space left on device"), ("no_permission", "denied")])
def test_a_failed_checkpoint_save_is_one_line_and_keeps_the_previous(tmp_path, request, fault, message):
    save_checkpoint(state(1), tmp_path, keep=2)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    request.getfixturevalue(fault)
    with pytest.raises(MachineFault, match=rf"could not write {tmp_path}/checkpoints/last.pt: .*{message}"):
        save_checkpoint(state(2), tmp_path, keep=2)  # torch.save raises a RuntimeError; its cause is found
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    assert load_checkpoint(tmp_path)["step"] == 1
    assert not list((tmp_path / "checkpoints").glob(f"{TMP_PREFIX}*"))


def test_a_failed_results_write_keeps_the_previous_results(tmp_path, monkeypatch):
    document = {"pe": "rope", "train_seq_len": 16, "results": []}
    path = write_document(document, tmp_path, PERPLEXITY_ROWS)
    before = path.read_bytes()
    monkeypatch.setattr(core.files, "open", lambda path, mode: FullDisk(path, room=10), raising=False)
    with pytest.raises(MachineFault, match=rf"could not write {path}: No space left on device"):
        write_document({**document, "results": [{"length": 16}] * 100}, tmp_path, PERPLEXITY_ROWS)
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_a_full_disk_while_writing_the_token_cache_says_the_way_out(tmp_path, full_disk):
    corpus = tmp_path / "book.txt"
    corpus.write_text("Some words to tokenize. " * 500)
    cfg = DataConfig(name="book", source="text", files=[str(corpus)], num_proc=1, cache_dir=str(tmp_path / "cache"))
    found = (
        r"cannot write the token cache .*book-.* \(could not write .*manifest.json: No space left on device\).*rm -r"
    )
    with pytest.raises(MachineFault, match=found):
        load_splits(cfg)


def test_a_full_disk_under_the_console_log_stops_in_one_line(tmp_path, monkeypatch):
    class FullLog(io.StringIO):
        name = str(tmp_path / "train.log")

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    log = FullLog()
    monkeypatch.setattr(sys, "stdout", core_cli._Tee(io.StringIO(), log))
    monkeypatch.setattr(sys, "stderr", core_cli._Tee(io.StringIO(), log))
    with pytest.raises(MachineFault, match=r"could not write .*train.log: No space left on device"):
        print("step 1")
    assert not isinstance(sys.stdout, core_cli._Tee) and not isinstance(sys.stderr, core_cli._Tee)


def test_any_write_on_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys):
    """The commands' last resort (core.cli): an OSError of the machine that nothing more specific caught."""
    path = tmp_path / "comparison.md"

    @core_cli.exit_on_user_error
    def command():
        with open(path, "w") as f:  # noqa: F841 (the open file names the failure)
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SystemExit) as exit_info:
        command()
    assert exit_info.value.code == IO_ERROR_EXIT_CODE
    assert capsys.readouterr().err == f"error: could not write {path}: No space left on device\n"


@pytest.mark.parametrize(
    "error, shown",
    [
        (  # what torch's CPU allocator raises for a block the system refuses (a legal size, pe.npos=2**31)
            RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory"),
            "out of memory (RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't ",
        ),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"), "out of memory (OutOfMemoryError: CUDA"),
        (MemoryError(), "out of memory; lower the batch"),
    ],
)
def test_running_out_of_memory_is_one_line(capsys, error, shown):
    """It was torch's traceback, exit 1."""

    @core_cli.exit_on_user_error
    def command():
        raise error

    with pytest.raises(SystemExit) as exit_info:
        command()
    assert exit_info.value.code == IO_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith(f"error: {shown}") and err.count("\n") == 1 and "lower the batch" in err


def test_read_user_text_names_the_byte_where_utf8_fails(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_bytes(b"def \xe9t\xe9():\r\n")
    with pytest.raises(PosGPTError, match=r"prompt_file: could not read .*prompt.txt: not valid UTF-8 at byte 4"):
        read_user_text(path, "sample.prompt_file")
    path.write_bytes(b"line\r\nnext\r")
    assert read_user_text(path, "x") == "line\nnext\n"  # as text mode reads it
    with pytest.raises(PosGPTError, match="is a directory"):
        read_user_text(tmp_path, "x")
    with pytest.raises(PosGPTError, match="does not exist"):
        read_user_text(tmp_path / "missing.txt", "x")


def test_unreadable_and_misplaced_checkpoints(tmp_path, monkeypatch):
    (tmp_path / "weights.pt").mkdir()
    with pytest.raises(PosGPTError, match="weights.pt is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path / "weights.pt")
    save_checkpoint(state(1), tmp_path, keep=0)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(PosGPTError, match=r"cannot read the checkpoint .*last.pt \(Permission denied\)"):
        load_checkpoint(tmp_path)


def test_a_speed_record_file_that_is_not_one(tmp_path):
    import speed

    path = tmp_path / "results.json"
    for content in (b"not json", b"[1, 2]", b"\xff\xfe"):
        path.write_bytes(content)
        with pytest.raises(PosGPTError, match=r"--record"):
            speed.read_results_file(path)
    path.write_text(json.dumps({"runs": []}))
    assert speed.read_results_file(path) == {"runs": []}


# Through the command lines.


@pytest.fixture(scope="module")
def trained(cli, tmp_path_factory):
    return reference_run(cli)


@pytest.mark.slow
def test_train_on_a_full_disk_is_one_line_and_keeps_the_checkpoint(cli, trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()

    def small_disk():  # files may not grow past 1 MB (a checkpoint is about 10 MB): writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    done = subprocess.run(
        [sys.executable, "train.py", *cli.overrides(run_dir, f"train.max_steps={STEPS + 3}", "train.resume=true")],
        cwd=REPO,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=small_disk,
    )
    assert_user_error(done, f"could not write {run_dir}/checkpoints/last.pt: File too large")
    assert f"still holds the last good checkpoint (step {STEPS})" in done.stderr
    assert done.returncode == IO_ERROR_EXIT_CODE and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == before
    assert not list((run_dir / "checkpoints").glob(f"{TMP_PREFIX}*"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, message",
    [(b"print('caf\xe9')", "sample.prompt_file: could not read"), (None, "is a directory")],
)
def test_a_bad_prompt_file_is_one_line(cli, trained, tmp_path, content, message):
    prompt = tmp_path / "prompt.txt"
    if content is None:
        prompt.mkdir()
    else:
        prompt.write_bytes(content)
    done = cli.run([sys.executable, "sample.py", f"run_dir={trained}", f"sample.prompt_file={prompt}"])
    assert_one_line_error(done, message)
    if content is not None:
        assert "not valid UTF-8 at byte 10" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, message",
    [
        (b"name: [rope\n", "line 2, column 1: not valid YAML"),
        (b"name: rope\n# caf\xe9\n", "not valid UTF-8 at byte 16"),
    ],
)
def test_a_bad_config_file_is_one_line(cli, tmp_path, content, message):
    (tmp_path / "configs" / "pe").mkdir(parents=True)
    (tmp_path / "configs" / "pe" / "mine.yaml").write_bytes(content)
    run_dir = tmp_path / "run"
    done = cli.run(
        [sys.executable, "train.py", "--config-dir", str(tmp_path / "configs"), *cli.overrides(run_dir, "pe=mine")]
    )
    assert_one_line_error(done, f"{tmp_path}/configs/pe/mine.yaml", message)
    assert not run_dir.exists()


# Bytes fixed once and for all (a CI gate must not fail by chance): seeded noise, and the classes of bytes that
# once failed, each a case of its own. A first byte 0x80 (PROTO) with a protocol torch does not know made torch
# print "UserWarning: Detected pickle protocol 17 ..." above the error line (bytes drawn afresh on each run began so
# about once in 256 runs); a lone STOP opcode is an IndexError in the unpickler.
BAD_PARENTS = {
    "seeded random bytes": random.Random(1000).randbytes(1000),
    "pickle protocol 17": b"\x80\x11" + random.Random(17).randbytes(998),
    "stop on an empty stack": b".",
    "a directory": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("garbage", BAD_PARENTS.values(), ids=BAD_PARENTS.keys())
def test_a_bad_parent_checkpoint_is_one_line(cli, tmp_path, garbage):
    """Through a real command line: a warning printed beside the error line is only seen on the process's stderr."""
    parent = tmp_path / "parent.pt"
    if garbage is None:
        parent.mkdir()
    else:
        parent.write_bytes(garbage)
    done = cli.train(tmp_path / "run", f"train.init_from={parent}")
    assert_one_line_error(done, "is a directory" if garbage is None else "is truncated or not a posgpt checkpoint")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_directory_that_is_a_file_is_one_line(cli, tmp_path):
    in_the_way = tmp_path / "run"
    in_the_way.write_text("notes")
    assert_one_line_error(cli.train_here(in_the_way), f"cannot make the directory {in_the_way}: a file is in the way")
    assert in_the_way.read_text() == "notes"


@pytest.mark.parametrize("marker", RUN_MARKERS)
@pytest.mark.parametrize("where", ["table.md", "export/run/eval/extrapolation.json", "notes/deep/table.csv"])
def test_no_output_lies_in_a_training_run_the_command_reads_but_its_own(tmp_path, marker, where):
    """check_outputs: anywhere in a training run among the inputs (known by any of its markers), at any depth (an
    export of a run into itself, a table written into a run it compares) is refused; the same path in a folder that
    is no run, or in the run the command writes itself (``run``), is not."""
    run, plain = tmp_path / "run", tmp_path / "plain"
    (run / marker).mkdir(parents=True)
    plain.mkdir()
    with pytest.raises(PosGPTError, match="lies in the training run .* which this command reads"):
        core.files.check_outputs({"--to": run / where}, inputs=[run])
    core.files.check_outputs({"--to": plain / where}, inputs=[plain])
    core.files.check_outputs({"--to": run / "report" / where}, inputs=[run], run=run)
