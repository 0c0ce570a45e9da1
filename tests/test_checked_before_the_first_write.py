"""A check that needs the model or the data runs before the run directory is written: the first step's overflow
(one forward pass of the first micro-batch), what an attention path cannot do on this machine, and a property of
the corpus that a setting depends on. Each is refused in one line, exit 2, and the run directory is never made."""

from __future__ import annotations

import pytest
from cli_runs import assert_one_line_error, train_losses

import training.loop

CASES = {
    "overflow": (["pe=fire", "pe.init_c=1e300"], "non-finite at step 1"),
    "a sink without a softmax": (["pe=stickbreaking", "model.attn_sink=true"], "model.attn_sink"),
    "FlexAttention's backward on a CPU": (["model.attn_backend=flex"], "cannot train on CPU"),
    "documents in a corpus of one": (["data.document_aware=true"], "is one document"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_the_run_directory_is_written(cli, tmp_path, case):
    settings, message = CASES[case]
    run = tmp_path / "run"
    done = cli.train_here(run, "train.max_steps=2", *settings)
    assert_one_line_error(done, message)
    assert not run.exists()


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
