"""One command at a time writes a run directory (core/rundir.py), and a command that does nothing changes nothing:
a second train.py, an eval.py or inspect_attention.py into a run that another command writes is refused in one
line naming the holder; the lock goes with its holder, even by kill -9, so the run resumes; a finished run's
resume rewrites nothing; a refused command leaves no empty run directory behind."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from cli_runs import REPO, STEPS, TIMEOUT_S, assert_one_line_error, reference_run, wait_for_step

from core import rundir
from core.checkpoint_io import load_checkpoint
from core.errors import PosGPTError
from core.files import check_outputs
from core.rundir import LOCK_FILE, lock_run, note_existing, removed_if_unused


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with lock_run(tmp_path):
        with pytest.raises(PosGPTError, match=rf"{tmp_path} is in use by .*\(pid {os.getpid()} on .*, started "):
            with lock_run(tmp_path):
                pass
    assert not (tmp_path / LOCK_FILE).exists()  # a command that ends leaves no lock file behind
    with lock_run(tmp_path):  # and the directory is free again
        pass


def test_a_lock_file_left_by_a_killed_holder_is_taken(tmp_path):
    (tmp_path / LOCK_FILE).write_text('{"pid": 1, "host": "gone", "command": "train.py", "started": "then"}')
    with lock_run(tmp_path):
        assert str(os.getpid()) in (tmp_path / LOCK_FILE).read_text()


def test_a_missing_run_directory_is_one_line(tmp_path):
    with pytest.raises(PosGPTError, match="does not exist"):
        with lock_run(tmp_path / "nowhere"):
            pass


def test_a_refused_command_removes_only_the_empty_directories_it_made(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "_EXISTING", None)
    made_before = tmp_path / "made before"
    made_before.mkdir()
    note_existing(made_before)  # what Hydra's callback does before it makes the run directory
    with pytest.raises(PosGPTError), removed_if_unused(made_before):
        raise PosGPTError("refused")
    assert made_before.is_dir()

    new = tmp_path / "2026-01-01" / "10-00-00-rope"
    note_existing(new)
    new.mkdir(parents=True)
    with pytest.raises(PosGPTError), removed_if_unused(new):
        raise PosGPTError("refused")
    assert list(tmp_path.iterdir()) == [made_before]  # the dated parent Hydra made goes too, tmp_path stays

    new.mkdir(parents=True)
    with removed_if_unused(new):
        (new / "metrics.jsonl").write_text("{}\n")
    assert (new / "metrics.jsonl").exists()


# The child signals once it runs its target, so after its at-fork hooks: the pid is printed only then (under
# load the parent could otherwise be killed before the child has run them).
HOLD_AND_FORK = """
import multiprocessing, os, sys, time
from core.rundir import lock_run
def wait(ready):
    open(ready, "w").close()
    time.sleep(60)
ready = os.path.join(sys.argv[1], "child-ready")
with lock_run(sys.argv[1]):
    child = multiprocessing.get_context("fork").Process(target=wait, args=(ready,))
    child.start()
    while not os.path.exists(ready):
        time.sleep(0.01)
    print(child.pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.slow
def test_a_forked_child_does_not_keep_a_killed_parents_lock(tmp_path):
    """flock belongs to the open file, which fork shares: a tokenizer worker would otherwise hold the run's lock
    after its parent was killed with -9."""
    parent = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_FORK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(timeout=TIMEOUT_S)
        with lock_run(tmp_path):  # the child is alive, the lock is free
            pass
    finally:
        os.kill(child, signal.SIGKILL)


@pytest.fixture(scope="module")
def finished_run(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lock") / "finished"
    shutil.copytree(reference_run(cli), run_dir)
    return run_dir


def snapshot(directory):
    return {path.relative_to(directory): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


@pytest.mark.slow
def test_resuming_a_finished_run_changes_nothing(cli, finished_run):
    before = snapshot(finished_run)
    done = cli.train_here(finished_run, f"train.max_steps={STEPS}", "train.resume=true")
    assert done.returncode == 0, done.stderr
    assert "nothing to do" in done.stdout
    assert snapshot(finished_run) == before  # .hydra/, train.log and no lock file left either


@pytest.mark.slow
def test_a_refused_command_leaves_no_run_directory(cli, tmp_path):
    done = cli.train_here(tmp_path / "2026-01-01" / "10-00-00-learned", "train.max_steps=0")
    assert_one_line_error(done, "train.max_steps=0 is out of its domain")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval.py", "scripts/inspect_attention.py"])
def test_evaluations_are_refused_while_another_command_writes_the_run(cli, finished_run, command):
    before = snapshot(finished_run)
    with lock_run(finished_run):
        done = cli.run([sys.executable, command, f"run_dir={finished_run}"])
    assert_one_line_error(done, f"{finished_run} is in use by", f"pid {os.getpid()}")
    assert snapshot(finished_run) == before


@pytest.mark.slow
def test_torchrun_is_refused_on_every_rank(cli, finished_run):
    with lock_run(finished_run):
        done = cli.torchrun(finished_run, f"train.max_steps={STEPS + 5}", "train.resume=true")
    # Refused on every rank, none left waiting for rank 0; torchrun then adds its own report (with a traceback of
    # its own), but none comes from posgpt's code.
    assert done.returncode != 0 and f"error: {finished_run} is in use by" in done.stderr, done.stderr
    assert "training/" not in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_one_training_per_run_directory_and_resume_after_kill_9(cli, tmp_path):
    run_dir = tmp_path / "run"
    first = cli.start_train(run_dir, "train.max_steps=100000", "train.checkpoint_every=5")
    try:
        wait_for_step(first, run_dir, 6)
        for extra in ([], ["train.resume=true"]):  # a second fresh run, or a resume, of the running one
            second = cli.train_here(run_dir, "train.max_steps=10", *extra)
            assert_one_line_error(second, f"{run_dir} is in use by train.py", f"pid {first.pid}")
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()  # kill -9: no handler runs, the lock file stays, the lock goes with the process
        first.wait(timeout=TIMEOUT_S)
    assert (run_dir / LOCK_FILE).exists()
    saved = load_checkpoint(run_dir)["step"]
    resumed = cli.train_here(run_dir, f"train.max_steps={saved + 2}", "train.resume=true")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stdout and not (run_dir / LOCK_FILE).exists()


def test_an_output_never_overwrites_an_input_or_a_runs_own_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "eval").mkdir()
    results = run / "eval" / "extrapolation.json"
    results.write_text("{}")
    with pytest.raises(
        PosGPTError, match=r"--markdown .*extrapolation.json would overwrite .*, which this command reads"
    ):
        check_outputs({"--markdown": results}, inputs=[run])
    with pytest.raises(PosGPTError, match=r"--plot .* lies in eval of the training run .*run, which only"):
        check_outputs({"--plot": run / "eval" / "new.png"})  # not read, but the run's own results
    check_outputs({"json": results}, inputs=[run / "checkpoints"], run=run)  # eval.py writing its own run
    with pytest.raises(PosGPTError, match="are the same file"):
        check_outputs({"--markdown": tmp_path / "a", "--plot": tmp_path / "b" / ".." / "a"})
    with pytest.raises(PosGPTError, match="is a directory"):
        check_outputs({"--plot": tmp_path})
    os.link(results, tmp_path / "link.json")  # another name of an input is the input
    with pytest.raises(PosGPTError, match="would overwrite"):
        check_outputs({"--to": tmp_path / "link.json"}, inputs=[results])
    exported = tmp_path / "exported" / "run"  # a copy of results, no run: export_results.py may overwrite it
    (exported / "eval").mkdir(parents=True)
    check_outputs({"--to": exported / "eval" / "extrapolation.json"}, inputs=[run])
    check_outputs({"--markdown": tmp_path / "comparison.md"}, inputs=[run])


@pytest.fixture(scope="module")
def evaluated_run(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("outputs") / "evaluated"
    shutil.copytree(reference_run(cli), run_dir)
    done = cli.eval_here(run_dir, "eval.lengths=[16]", "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("option", ["--markdown", "--plot"])
def test_compare_refuses_to_write_over_a_runs_results(cli, evaluated_run, option):
    before = snapshot(evaluated_run)
    target = evaluated_run / "eval" / ("extrapolation.json" if option == "--markdown" else "ppl_vs_length.png")
    done = cli.here("scripts/compare.py", str(evaluated_run), option, str(target))
    assert_one_line_error(done, f"{option} {target}", "nothing was written")
    assert snapshot(evaluated_run) == before


@pytest.mark.slow
def test_export_refuses_to_write_over_what_it_exports(cli, evaluated_run):
    before = snapshot(evaluated_run)
    done = cli.here("scripts/export_results.py", str(evaluated_run), "--to", str(evaluated_run.parent))
    assert_one_line_error(done, "would overwrite", "nothing was written")
    assert snapshot(evaluated_run) == before
