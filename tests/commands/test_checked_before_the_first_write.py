"""A check that needs the model or the data runs before the run directory is written: the first step's overflow
(one forward pass of the first micro-batch), what an attention path cannot do on this machine, and a property of
the corpus that a setting depends on. Each is refused in one line, exit 2, and the run directory is never made;
``train.py --check`` refuses each alike (training.loop.rehearse makes the same checks), and so does a sweep before its
first job trains, when a later job is the one refused."""

from __future__ import annotations

import pytest
from cli_runs import assert_one_line_error, train_losses

import training.loop

# Each case: its settings (the last one refused, with the others), what the refusal says, and a value of that last
# setting that trains.
CASES = {
    "overflow": (["pe=fire", "pe.init_c=1e300"], "non-finite at step 1", "0.1"),
    "a sink without a softmax": (["pe=stickbreaking", "model.attn_sink=true"], "model.attn_sink", "false"),
    "FlexAttention's backward on a CPU": (["model.attn_backend=flex"], "cannot train on CPU", "auto"),
    "documents in a corpus of one": (["data.document_aware=true"], "is one document", "false"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_the_run_directory_is_written(cli, tmp_path, case):
    settings, message, _ = CASES[case]
    run = tmp_path / "run"
    done = cli.train_here(run, "train.max_steps=2", *settings)
    assert_one_line_error(done, message)
    assert not run.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_what_the_run_refuses(cli, tmp_path, case):
    settings, message, _ = CASES[case]
    run = tmp_path / "run"
    done = cli.here("train.py", "--check", *cli.overrides(run, "train.max_steps=2", *settings))
    assert_one_line_error(done, message)
    assert not run.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_sweep_refuses_a_later_job_before_the_first_trains(cli, tmp_path, case):
    """The sweep's second job holds the case's settings; its first, the refused setting's value that trains."""
    settings, message, trains = CASES[case]
    key, refused = settings[-1].split("=", 1)
    swept = f"{key}={trains},{refused}"
    sweep = tmp_path / "sweep"
    overrides = [o for o in cli.overrides(tmp_path / "run", "train.max_steps=2", *settings[:-1]) if "hydra" not in o]
    done = cli.here("train.py", "-m", *overrides, swept, f"hydra.sweep.dir={sweep}")
    assert_one_line_error(done, "job 1 of the sweep", message)
    assert not sweep.exists()


@pytest.mark.slow
def test_the_first_forward_changes_nothing_the_run_trains(cli, tmp_path, monkeypatch):
    """The check's forward draws from a stream of its own, in eval mode, on a copy of the random state: with
    dropout (which draws from that state) the run trains bit-identically to one without the check."""
    settings = ["train.max_steps=6", "model.dropout=0.1"]
    checked = cli.train_here(tmp_path / "checked", *settings)
    monkeypatch.setattr(training.loop, "_check_first_forward", lambda *args: None)
    unchecked = cli.train_here(tmp_path / "unchecked", *settings)
    assert checked.returncode == unchecked.returncode == 0, checked.stderr + unchecked.stderr
    assert train_losses(tmp_path / "checked") == train_losses(tmp_path / "unchecked")


def test_check_reads_the_run_directory_as_hydra_does(tmp_path):
    """--check rehearses a resume in the directory the run will use: a quoted path is that path, a sweep's jobs its
    numbered subdirectories, a name Hydra makes at run time (the time in it) a new directory."""
    from experiment.compose import NEW_RUN_DIR, planned_run_dirs

    spaced = tmp_path / "a run"
    assert planned_run_dirs([f"hydra.run.dir='{spaced}'"], 1) == [spaced]
    assert planned_run_dirs(["-m", f"hydra.sweep.dir={tmp_path}", "pe=rope,alibi"], 2) == [
        tmp_path / "0",
        tmp_path / "1",
    ]
    assert planned_run_dirs(["hydra.run.dir=outputs/${now:%H-%M-%S}"], 1) == [NEW_RUN_DIR]
    assert planned_run_dirs(["-m", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=x"], 1) == [NEW_RUN_DIR]
