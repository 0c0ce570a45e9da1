"""The data pipeline's promises through the real command lines (issue #12 and #8.5): a damaged token cache is
repaired, a changed corpus is noticed (and refused on resume), duplicates and rows without text are reported,
unreadable files get one line, a signal while tokenizing leaves no worker behind, and eval.py scores the
split data.eval_split asks for. Tiny runs: a few steps, train.eval_after=false, in-process (cli.here, as
``python train.py ...`` would run); the signals are sent to real processes.
"""

from __future__ import annotations

from core.interrupts import is_plain_ctrl_c

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from cli_runs import TINY, Runner, assert_user_error

from data.cache import _signals_stop_workers

STDLIB = Path(sysconfig.get_paths()["stdlib"])

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> Runner:
    """A Runner of its own: these tests damage and edit its corpus and token cache."""
    return Runner(tmp_path_factory.mktemp("data-cli"))


def train(cli: Runner, run_dir: Path, files: list[Path], *extra: str) -> subprocess.CompletedProcess:
    """train.py on `files` (instead of the runner's corpus), with this module's own token cache."""
    return cli.here(
        "train.py",
        *TINY,
        f"data.files=[{','.join(map(str, files))}]",
        f"data.cache_dir={cli.base / 'cache'}",
        f"hydra.run.dir={run_dir}",
        *extra,
    )


def entry(cli: Runner, name: str = "text") -> Path:
    """The one token cache entry of data `name` that has a manifest (fails if there are several)."""
    (folder,) = [path.parent for path in (cli.base / "cache").glob(f"{name}-*/manifest.json")]
    return folder


def eval_rows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "eval" / "extrapolation.json").read_text())["results"]


EVAL_FAST = ["eval.lengths=[16]", "eval.protocols=[nonoverlapping]", "logging.progress=false"]


@pytest.fixture(scope="module")
def book(cli: Runner) -> Path:
    """A corpus of one document (~13K tokens, split by tokens) that the tests below damage and edit."""
    path = cli.base / "book.txt"
    path.write_text((STDLIB / "argparse.py").read_text()[:30_000])
    return path


@pytest.fixture(scope="module")
def book_run(cli: Runner, book: Path) -> Path:
    run_dir = cli.base / "book-run"
    done = train(cli, run_dir, [book], "train.max_steps=2")
    assert done.returncode == 0, done.stderr
    return run_dir


def test_truncated_shard_is_tokenized_again_and_eval_scores_the_training_val_split(cli, book_run):
    folder = entry(cli)
    shard = folder / "all_000000.bin"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    done = cli.eval_here(book_run, *EVAL_FAST)
    assert done.returncode == 0, done.stderr
    assert "1 shard(s) of" in done.stdout and "do not match the manifest (all_000000.bin)" in done.stdout
    assert shard.stat().st_size == size
    # eval_split=auto found the training corpus (its tokens match the checkpoint's): the val split, scored.
    assert "scoring the val split of text (the corpus the run was trained on)" in done.stdout
    (row,) = eval_rows(book_run)
    assert row["split"] == "val" and row["data"] == "text" and row["corpus"] == f"files {cli.base / 'book.txt'}"
    assert row["ppl"] is not None and 0 < row["tokens"] < 200  # in the last 1% of ~13K tokens


def test_malformed_manifest_is_rebuilt_and_resume_accepts_the_same_tokens(cli, book_run):
    (entry(cli) / "manifest.json").write_text('[{"shards": []}]')
    done = train(cli, book_run, [cli.base / "book.txt"], "train.resume=true", "train.max_steps=3")
    assert done.returncode == 0, done.stderr
    assert "manifest.json is not a valid manifest (a list, not an object): tokenizing the entry again" in done.stdout
    assert "resuming" in done.stdout and "Traceback" not in done.stderr


def test_corpus_edited_in_place_is_noticed_and_resume_refuses_it(cli, book, book_run):
    stat = book.stat()
    text = book.read_text()
    book.write_text(text.replace("parser", "Parser"))  # same size
    os.utime(book, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and same mtime
    assert book.stat().st_size == stat.st_size and book.stat().st_mtime_ns == stat.st_mtime_ns
    try:
        done = train(cli, book_run, [book], "train.resume=true", "train.max_steps=4")
        assert "data: tokenizing text" in done.stdout  # a new cache entry: the content changed
        assert_user_error(
            done,
            "data 'text' (files ",
            "book.txt) holds other tokens than the checkpoint was trained on",
            "Restore that corpus to resume",
        )
    finally:
        book.write_text(text)  # the other tests use the original book


def test_eval_of_another_corpus_scores_all_of_it(cli, book_run):
    other = cli.base / "other.txt"
    other.write_text((STDLIB / "difflib.py").read_text()[:20_000])
    done = cli.eval_here(book_run, "data=text", "data.name=other", f"data.files=[{other}]", *EVAL_FAST)
    assert done.returncode == 0, done.stderr
    assert "scoring the all split of other (not the corpus the run was trained on)" in done.stdout
    row = next(row for row in eval_rows(book_run) if row["data"] == "other")
    # All ~5K tokens are available; the scored targets are the largest multiple of 16 after the first 16.
    assert row["split"] == "all" and row["corpus"] == f"files {other}" and row["tokens"] > 4000
    # (data.eval_split=val|train|all: tests/data/test_cache.py::test_eval_split)


def test_duplicates_and_rows_without_text_are_reported(cli, tmp_path, book):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"text": f"Row {i}: " + "words " * 40} if i % 4 else {"body": "x"}) + "\n" for i in range(40)
        )
    )
    done = train(cli, tmp_path / "run", [book, book, rows], "train.max_steps=1")
    assert done.returncode == 0, done.stderr
    assert "data: text: dropped 1 of 32 documents whose text repeats an earlier one" in done.stdout
    assert f"data: warning: {rows}: skipped 10 of 40 rows that have no 'text' value" in done.stdout


def test_mostly_missing_text_is_refused(cli, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"text": f"Row {i}."} if i % 4 == 0 else {"body": "x"}) + "\n" for i in range(40))
    )
    assert_user_error(
        train(cli, tmp_path / "run", [rows]), f"{rows}: 30 of 40 rows have no 'text' value", "set data.text_field"
    )


def test_invalid_utf8_names_the_file_and_byte(cli, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("Ein schöner Tag.".encode("latin-1"))
    assert_user_error(
        train(cli, tmp_path / "run", [latin]),
        f"data.files: could not read {latin}: not valid UTF-8 at byte 7 (invalid start byte)",
    )


def _children(pid: int) -> set[int]:
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            children.add(int(stat.parent.name))
    return children


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 128 + signal.SIGINT)])
def test_signal_while_tokenizing_stops_the_workers(cli, tmp_path, signum, code):
    """The standard library in small shards over 2 processes: a signal once the workers run ends them all."""
    command = [
        sys.executable,
        "train.py",
        *[o for o in TINY if o != "data=text"],
        "data=python_stdlib",
        "data.shard_chars=100000",
        "data.num_proc=2",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    process = cli.start_interruptible(command)  # SIGINT delivered even where this test inherits it ignored
    try:
        deadline = time.monotonic() + 120
        while len(workers := _children(process.pid)) < 2:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == code, err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers), "tokenizer workers outlived the run"
    manifest = json.loads(next((tmp_path / "cache").glob("python_stdlib-*/manifest.json")).read_text())
    assert manifest["complete"] is False


@pytest.mark.skipif(
    not is_plain_ctrl_c(signal.getsignal(signal.SIGINT)),
    reason="Ctrl-C has a custom handler here, which _signals_stop_workers leaves alone",
)
def test_a_signal_swallowed_after_the_last_result_is_delivered_when_tokenizing_ends():
    """A Ctrl-C whose KeyboardInterrupt was raised where Python ignores it (a callback), after the last result
    was checked, still ends the run: the block delivers the remembered signal on its way out."""
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _signals_stop_workers():
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass  # what an exception-ignoring callback does to it
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back
