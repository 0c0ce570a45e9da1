"""End to end through the real command lines: train.py then eval.py, for every positional scheme."""

import json
import math

import pytest

from clihelpers import read_jsonl, run_cli, small_corpus, tiny_overrides
from model.pe import SCHEMES


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.parametrize("pe", sorted(SCHEMES))
def test_train_then_eval_every_scheme(pe, corpus, tmp_path):
    run_dir = tmp_path / "run"
    run_cli("train.py", [f"pe={pe}", "train.eval_after=false", *tiny_overrides(corpus, run_dir)])

    assert (run_dir / "checkpoints" / "last.pt").is_file()
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    train_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    val_losses = [m["val_loss"] for m in metrics if "val_loss" in m]
    assert [m["step"] for m in metrics if "train_loss" in m] == list(range(1, 13))
    assert all(math.isfinite(loss) for loss in train_losses + val_losses)
    assert sum(train_losses[-3:]) / 3 < train_losses[0] - 0.5, train_losses
    assert len(val_losses) == 3 and val_losses[-1] < val_losses[0], val_losses
    assert {m.get("tokens_per_s") is not None for m in metrics if "train_loss" in m} == {True}
    offline_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline_runs and any(offline_runs[0].glob("run-*.wandb"))

    result = run_cli("eval.py", [f"run_dir={run_dir}", "eval.length_multipliers=[1,4]", "eval.max_tokens=256",
                                 "logging.progress=false"])
    assert "1x" in result.stdout and "4x" in result.stdout  # the table is printed
    document = json.loads((run_dir / "eval" / "extrapolation.json").read_text())
    assert document["pe"] == pe and document["train_seq_len"] == 16
    rows = {(r["length"], r["protocol"]): r for r in document["results"]}
    assert {length for length, _ in rows} == {16, 64}
    assert math.isfinite(rows[(16, "nonoverlapping")]["ppl"])
    assert rows[(16, "nonoverlapping")]["tokens"] > 0
    four_x = rows[(64, "nonoverlapping")]
    if pe == "learned":
        assert four_x["ppl"] is None and "16 positions" in four_x["reason"]
    else:
        assert math.isfinite(four_x["ppl"]) and four_x["ppl"] > 1


def test_main_job_shape_trains_and_evaluates_in_one_command(corpus, tmp_path):
    """python train.py ends by evaluating (train.eval_after defaults to true) and prints the table."""
    run_dir = tmp_path / "run"
    result = run_cli("train.py", ["pe=alibi", "logging.wandb.mode=disabled", *tiny_overrides(corpus, run_dir)])
    assert "pe=alibi ppl" in result.stdout
    assert (run_dir / "eval" / "extrapolation.json").is_file()
    assert not (run_dir / "wandb").exists()
