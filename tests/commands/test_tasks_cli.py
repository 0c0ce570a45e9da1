"""train.py task=... then eval.py, through the command lines (tiny models, a few steps): the task's results
files and plots, n/a past a learned table, evaluation-time variations, refused task overrides, and an exact
resume of a task run."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from cli_runs import assert_one_line_error, reference_run, train_losses

pytestmark = pytest.mark.slow

# Few examples per cell (eval.task_half_width=0.25: n=16) and one grid depth keep the evaluation short.
QUICK_EVAL = ["eval.task_half_width=0.25", "eval.task_depths=[0.5]"]


@pytest.fixture(scope="module")
def passkey_run(cli):
    """pe=learned (TINY's scheme, seq_len 16) on passkey, evaluated when training ends (a 3-symbol key, so that
    the task's 0.5x, 8 tokens, fits)."""
    run_dir = cli.base / "task-passkey"
    done = cli.train_here(
        run_dir, "task=passkey", "task.key_len=3", "train.max_steps=6", "train.eval_after=true", *QUICK_EVAL
    )
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.fixture(scope="module")
def mqar_run(cli):
    run_dir = cli.base / "task-mqar"
    done = cli.train_here(run_dir, "task=mqar", "pe=rope", "task.n_pairs=2", "train.max_steps=8")
    assert done.returncode == 0, done.stderr
    return run_dir


def test_a_task_run_writes_accuracy_by_length_and_depth(passkey_run):
    eval_dir = passkey_run / "eval"
    document = json.loads((eval_dir / "tasks.json").read_text())
    assert document["task"] == "passkey" and document["step"] == 6 and document["train_seq_len"] == 16
    assert document["config"]["model"]["vocab_size"] == 17  # the task's vocabulary, not GPT-2's
    rows = document["results"]
    lengths = (8, 12, 16, 32, 64, 128, 256)  # 0.5x and 0.75x too
    assert {(r["length"], r["depth"]) for r in rows} == {(L, d) for L in lengths for d in (None, 0.5)}
    for row in rows:
        if row["length"] <= 16:
            assert row["n"] == 16 and 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
            # each of the key's 3 answer tokens counted over the 16 examples; an exact match has every one right
            assert row["answer_n"] == [16] * 3 and row["correct"] <= min(row["answer_correct"])
        else:  # past the learned table: not evaluable, as perplexity
            assert row["accuracy"] is None and "encodes at most 16 positions" in row["reason"]
    assert document["effective_length"] == {"": None}  # 6 steps: far from 0.9
    with open(eval_dir / "tasks.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert {"task", "length", "depth", "accuracy", "ci_low", "ci_high", "n"} <= set(table[0])
    assert (eval_dir / "accuracy_vs_length.png").stat().st_size > 0
    assert (eval_dir / "depth_length.png").stat().st_size > 0
    assert not (eval_dir / "extrapolation.json").exists()


def test_eval_measures_variations_and_accumulates(cli, mqar_run):
    done = cli.eval_here(
        mqar_run, "eval.lengths=[16,64]", "eval.variations=[none,yarn:4]", "eval.task_half_width=0.25"
    )  # MQAR has no depths to grid
    assert done.returncode == 0, done.stderr
    assert "effective length" in done.stdout
    done = cli.eval_here(mqar_run, "eval.lengths=[32]", "eval.task_half_width=0.3")
    assert done.returncode == 0, done.stderr
    rows = json.loads((mqar_run / "eval" / "tasks.json").read_text())["results"]
    cells = {(r["length"], r["variation_settings"]["scaling"]["type"], r["n"]) for r in rows}
    assert cells == {(16, "none", 16), (64, "none", 16), (16, "yarn", 16), (64, "yarn", 16), (32, "none", 11)}
    assert all(r["depth"] is None for r in rows)  # MQAR has no depth


@pytest.mark.parametrize("override", ["task.n_pairs=3", "task=passkey", "model.vocab_size=100"])
def test_eval_refuses_what_would_change_the_trained_task(cli, mqar_run, override):
    assert_one_line_error(cli.eval_here(mqar_run, override), "cannot be changed for an evaluation")


@pytest.mark.parametrize(
    ("task", "override", "message"),
    [
        ("mqar", "task.min_pairs=9", "task.min_pairs=9 is more than task.n_pairs=8"),
        ("mqar", "task.power_a=0", "task.power_a=0.0 is out of its domain (0, 1]"),
        ("mqar", "task.power_a=1.5", "task.power_a=1.5 is out of its domain (0, 1]"),
        (
            "needles",
            "task.n_queries=5",
            "task.n_queries=5 distinct needles to query need task.n_keys >= n_queries (got 4)",
        ),
        ("needles", "task.n_queries=0", "task.n_queries=0 is out of its domain [1, inf)"),
    ],
)
def test_train_refuses_impossible_task_settings_before_writing(cli, task, override, message):
    run_dir = cli.base / f"task-{task}-refused"
    assert_one_line_error(cli.train_here(run_dir, f"task={task}", override), message)
    assert not run_dir.exists()


def test_train_refuses_a_copy_probe_it_could_not_run_before_writing(cli):
    """eval.copy_min_count is checked against the training split before the first step, not after the last."""
    reference_run(cli)  # its corpus is tokenized: the refusal is then the command's only output
    run_dir = cli.base / "probe-refused"
    probe = ["train.eval_after=true", "eval.tasks=[copy_probe]", "eval.copy_min_count=1000000000"]
    assert_one_line_error(cli.train_here(run_dir, *probe), "eval.copy_min_count=1000000000 leaves 0 token(s)")
    assert not run_dir.exists()


def test_a_task_run_resumes_exactly(cli, mqar_run):
    run_dir = cli.base / "task-mqar-resumed"
    first = cli.train_here(run_dir, "task=mqar", "pe=rope", "task.n_pairs=2", "train.max_steps=4")
    assert first.returncode == 0, first.stderr
    second = cli.train_here(run_dir, "task=mqar", "pe=rope", "task.n_pairs=2", "train.max_steps=8", "train.resume=true")
    assert second.returncode == 0, second.stderr
    assert train_losses(run_dir) == train_losses(mqar_run)


def test_copy_probe_on_a_language_model_run(cli):
    run_dir = cli.base / "probe-run"  # a copy: the shared reference run stays read-only
    shutil.copytree(reference_run(cli) / "checkpoints", run_dir / "checkpoints")
    probe = ["eval.tasks=[copy_probe]", "eval.copy_span=4", "eval.task_half_width=0.3", "eval.lengths=[16,32]"]
    done = cli.eval_here(run_dir, *probe, "eval.protocols=[nonoverlapping]")
    assert done.returncode == 0, done.stderr
    rows = json.loads((run_dir / "eval" / "tasks.json").read_text())["results"]
    assert {(r["length"], r["distance"]) for r in rows} == {(16, 12), (32, 12), (32, 28)}
    for row in rows:
        if row["length"] == 16:
            assert row["n"] == 11 and row["mean_logprob"] < 0 and 0 <= row["token_accuracy"] <= 1
            assert row["split"] == "val" and row["data"] == "text"
        else:  # TINY's pe=learned ends at 16 positions
            assert row["accuracy"] is None and "encodes at most" in row["reason"]
    assert (run_dir / "eval" / "distance_length.png").exists()
    scored = [row for row in rows if row["accuracy"] is not None]
    assert all(row["copy_gain"] == pytest.approx(row["mean_logprob"] - row["control_logprob"]) for row in scored)
    assert {row["copy_candidates"] for row in rows} == {50256} and {row["copy_min_count"] for row in rows} == {0}

    # spans of frequent training tokens only: rows beside the first probe's, never replacing them
    frequent = cli.eval_here(run_dir, *probe, "eval.protocols=[nonoverlapping]", "eval.copy_min_count=3")
    assert frequent.returncode == 0, frequent.stderr
    rows = json.loads((run_dir / "eval" / "tasks.json").read_text())["results"]
    assert sorted(row["copy_min_count"] for row in rows) == [0, 0, 0, 3, 3, 3]
    assert 10 < min(row["copy_candidates"] for row in rows) < 50256
    assert "copy_min_count=3" in frequent.stdout and "copy_gain (nats the first copy adds)" in frequent.stdout
    assert (run_dir / "eval" / "distance_length_copy_min_count=3.png").exists()
    assert not (run_dir / "eval" / "distance_length.png").exists()  # it held the first probe alone
    before = (run_dir / "eval" / "tasks.json").read_text()
    refused = cli.eval_here(run_dir, *probe, "eval.protocols=[nonoverlapping]", "eval.copy_min_count=1000000000")
    assert_one_line_error(refused, "eval.copy_min_count=1000000000 leaves 0 token(s)")
    assert (run_dir / "eval" / "tasks.json").read_text() == before
    assert "eval: wrote" not in refused.stdout  # refused before the perplexity evaluation, not after it
