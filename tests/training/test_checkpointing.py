"""Checkpoints you can trust, through real train.py runs: a resumed run is bit-identical to an uninterrupted
one, SIGTERM saves and exits cleanly, and kill -9 loses at most train.checkpoint_every steps. The runs that
are stopped are real processes; the resumes that follow run in-process (cli.train_here), as
``python train.py ...`` would, against the session's reference run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from cli_runs import REPO, STEPS, TIMEOUT_S, assert_user_error, train_losses, wait_for_step

from core.checkpoint_io import load_checkpoint
from evaluation.evaluators.copy_probe import CopyProbe
from training.checkpointing import Checkpointer

pytestmark = pytest.mark.slow


def load_last(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)


def test_resume_continues_bit_identically(cli, reference, tmp_path):
    run_dir = tmp_path / "run"
    # The first half in-process, the second in a process of its own: what resumes is only what was saved.
    first = cli.train_here(
        run_dir, f"train.max_steps={STEPS // 2}", "train.checkpoint_every=7", "logging.wandb.mode=offline"
    )
    assert first.returncode == 0, first.stderr
    checkpoint = load_last(run_dir)
    assert checkpoint["step"] == STEPS // 2
    assert {"optimizer", "scheduler", "rng", "sampler_state", "wandb_run_id"} <= checkpoint.keys()
    run_id = checkpoint["wandb_run_id"]
    assert run_id

    resumed = cli.train(
        run_dir,
        f"train.max_steps={STEPS}",
        "train.resume=true",
        "train.checkpoint_every=7",
        "logging.wandb.mode=offline",
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {run_dir} from step {STEPS // 2}" in resumed.stdout
    assert f"train.max_steps is now {STEPS} (was {STEPS // 2})" in resumed.stdout
    # Exact float equality: the same batches, weights, moments and learning rates as one uninterrupted run.
    assert train_losses(run_dir) == train_losses(reference)
    assert load_last(run_dir)["wandb_run_id"] == run_id  # logs into the same W&B run
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
    # keep_checkpoints=2 step files besides last.pt
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "last.pt",
        "step_00000035.pt",
        f"step_{STEPS:08d}.pt",
    ]


def test_sigterm_saves_a_checkpoint_and_exits(cli, reference, tmp_path):
    run_dir = tmp_path / "run"
    # No periodic checkpoint before the end: the one found afterwards was written on SIGTERM.
    process = cli.start_train(run_dir, f"train.max_steps={STEPS}", "train.checkpoint_every=1000")
    wait_for_step(process, run_dir, 5)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output
    step = load_last(run_dir)["step"]
    assert 5 <= step < STEPS
    assert f"stopped by SIGTERM at step {step}; checkpoint saved" in output
    assert max(train_losses(run_dir)) == step

    resumed = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true")
    assert resumed.returncode == 0, resumed.stderr
    assert train_losses(run_dir) == train_losses(reference)


def test_kill_9_loses_at_most_checkpoint_every_steps(cli, reference, tmp_path):
    run_dir, every = tmp_path / "run", 3
    process = cli.start_train(run_dir, f"train.max_steps={STEPS}", f"train.checkpoint_every={every}")
    wait_for_step(process, run_dir, 10)
    process.kill()  # SIGKILL: no handler runs, possibly in the middle of writing a checkpoint
    process.communicate(timeout=TIMEOUT_S)
    logged = max(train_losses(run_dir))
    assert logged - every <= load_last(run_dir)["step"] <= logged  # last.pt is whole and recent

    resumed = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true")
    assert resumed.returncode == 0, resumed.stderr
    assert train_losses(run_dir) == train_losses(reference)  # metrics.jsonl was cut back, then redone
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # a killed save's temporary file is gone


def test_resuming_a_finished_run_does_nothing(cli, reference):
    run_dir = reference  # it writes nothing: then the reference stays as it was for the other tests
    metrics, checkpoint = (run_dir / "metrics.jsonl").read_bytes(), (run_dir / "checkpoints" / "last.pt").read_bytes()
    done = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true")
    assert done.returncode == 0, done.stderr
    assert f"has already trained {STEPS} steps" in done.stdout
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == checkpoint


def test_resume_without_a_checkpoint_is_an_error(cli, tmp_path):
    done = cli.train_here(tmp_path / "never-trained", "train.resume=true")
    assert_user_error(done, "train.resume=true but", "holds no checkpoint")


def test_a_signal_during_the_final_save_stops_before_the_evaluation(cli, tmp_path, monkeypatch):
    """A SIGTERM that arrives while the last step's checkpoint is written (after the loop's last look at it) still
    stops the run: exit 128 + 15 with the checkpoint saved and no evaluation, as at any other step; the resume
    runs the evaluation. (It used to be swallowed: the run went on to evaluate and exited 0.)"""
    run_dir, steps = tmp_path / "run", 3
    save = Checkpointer.save

    def save_then_signal(self, step, *args, **kwargs):
        save(self, step, *args, **kwargs)
        if step == steps:
            os.kill(os.getpid(), signal.SIGTERM)  # caught by the loop's handler, as a scheduler's would be

    monkeypatch.setattr(Checkpointer, "save", save_then_signal)
    done = cli.train_here(run_dir, f"train.max_steps={steps}", "train.eval_after=true", "eval.lengths=[16]")
    assert done.returncode == 128 + signal.SIGTERM, done.stdout + done.stderr
    assert f"stopped by SIGTERM at step {steps}; checkpoint saved" in done.stdout
    assert load_checkpoint(run_dir)["step"] == steps
    assert not (run_dir / "eval" / "extrapolation.json").exists()
    monkeypatch.undo()
    resumed = cli.train_here(
        run_dir, f"train.max_steps={steps}", "train.eval_after=true", "eval.lengths=[16]", "train.resume=true"
    )
    assert resumed.returncode == 0 and "end-of-training evaluation did not finish" in resumed.stdout


def test_a_run_stopped_between_its_perplexity_and_its_probe_is_not_done(cli, tmp_path, monkeypatch):
    """With eval.tasks=[copy_probe] the end-of-training evaluation writes the perplexity, then the probe's rows.
    Stopped between the two, the run is not done: resumed, it runs that evaluation (it used to say "nothing to
    do", and scripts/study.sh, which resumes through it, skipped the run's probe for good)."""
    run_dir, steps = tmp_path / "run", 3
    evaluation = ["train.eval_after=true", "eval.lengths=[16]", "eval.protocols=[nonoverlapping]"]
    probe = [*evaluation, "eval.tasks=[copy_probe]", "eval.copy_span=4", "eval.task_half_width=0.3"]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C: what a stopped process leaves is what matters here

    monkeypatch.setattr(CopyProbe, "run", stopped)
    stopped_run = cli.train_here(run_dir, f"train.max_steps={steps}", *probe)
    assert stopped_run.returncode == 128 + signal.SIGINT and "interrupted" in stopped_run.stderr
    monkeypatch.undo()
    assert (run_dir / "eval" / "extrapolation.json").exists() and not (run_dir / "eval" / "tasks.json").exists()

    resumed = cli.train_here(run_dir, f"train.max_steps={steps}", "train.resume=true", *probe)
    assert resumed.returncode == 0, resumed.stderr
    assert "end-of-training evaluation did not finish" in resumed.stdout
    assert json.loads((run_dir / "eval" / "tasks.json").read_text())["step"] == steps
    done = cli.train_here(run_dir, f"train.max_steps={steps}", "train.resume=true", *probe)
    assert done.returncode == 0 and f"has already trained {steps} steps" in done.stdout
    (run_dir / "eval" / "tasks.json").unlink()
    plain = tmp_path / "plain"
    shutil.copytree(run_dir, plain)
    # a resume starts from the run's stored settings: one that leaves the probe out still runs it
    kept = cli.train_here(run_dir, f"train.max_steps={steps}", "train.resume=true", *evaluation)
    assert kept.returncode == 0 and "end-of-training evaluation did not finish" in kept.stdout, kept.stderr
    assert (run_dir / "eval" / "tasks.json").exists()
    # with the probes given away, the perplexity alone is the evaluation: done
    done = cli.train_here(plain, f"train.max_steps={steps}", "train.resume=true", *evaluation, "eval.tasks=[]")
    assert done.returncode == 0 and f"has already trained {steps} steps" in done.stdout


def test_sigterm_during_the_final_evaluation_then_resume_runs_it(cli, tmp_path):
    """Stopped while it evaluates after training (made to last seconds: a sliding window at stride 1), the
    resumed run runs the evaluation it missed, instead of reporting nothing to do."""
    run_dir, steps = tmp_path / "run", 3
    heavy_eval = ["train.eval_after=true", "eval.protocols=[sliding]", "eval.stride=1", "eval.lengths=[16]"]
    # The evaluation's progress bar (on stderr, to a file read below) tells that it has started. Waiting for
    # last.pt instead would signal a process that may not have left the training loop yet, whose handler
    # would then take the SIGTERM for itself: on a loaded machine that happened.
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr:
        command = [sys.executable, "train.py", *cli.overrides(run_dir, f"train.max_steps={steps}", *heavy_eval)]
        process = subprocess.Popen(
            [*command, "logging.progress=true"], cwd=REPO, env=cli.env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    deadline = time.monotonic() + TIMEOUT_S
    while "length/s" not in stderr_path.read_text():  # eval's bar counts lengths; training's counts steps
        assert process.poll() is None, process.stdout.read() + stderr_path.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=TIMEOUT_S)
    assert process.returncode == -signal.SIGTERM, output  # outside the loop a signal acts as usual
    assert not (run_dir / "eval" / "extrapolation.json").exists()

    resumed = cli.train_here(run_dir, f"train.max_steps={steps}", "train.resume=true", *heavy_eval)
    assert resumed.returncode == 0, resumed.stderr
    assert "end-of-training evaluation did not finish" in resumed.stdout
    document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
    assert document["step"] == steps and [row["length"] for row in document["results"]] == [16]
    assert document["config"] == load_checkpoint(run_dir)["config"]  # what scored the rows: the trained model
    log = (run_dir / "train.log").read_text()  # the console log of both starts
    assert "train: pe=learned" in log and "did not finish" in log


def test_resume_reads_settings_added_since_the_checkpoint_as_their_defaults(cli, reference, tmp_path):
    """A checkpoint written before a setting existed resumes (the setting reads as its default), and a setting
    whose default changed since reads as its legacy value: a resume keeps it, and one that gives today's default
    is refused."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    path = run_dir / "checkpoints" / "last.pt"
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["config"]["model"]["dropout"]  # default 0.0, the value it was trained with
    torch.save(checkpoint, path)
    done = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true")
    assert done.returncode == 0 and f"has already trained {STEPS} steps" in done.stdout, done.stderr
    del checkpoint["config"]["model"]["embedding"]  # before model.embedding existed, runs used GPT-2's
    torch.save(checkpoint, path)
    kept = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true")
    assert kept.returncode == 0 and f"has already trained {STEPS} steps" in kept.stdout, kept.stderr
    refused = cli.train_here(run_dir, f"train.max_steps={STEPS}", "train.resume=true", "model.embedding=fairseq")
    assert_user_error(refused, "cannot resume", "model.embedding=gpt2 (now fairseq)")
