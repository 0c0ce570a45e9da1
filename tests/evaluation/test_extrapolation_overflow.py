"""Numbers that do not fit, and settings that cannot be produced: a diverged model's perplexity is inf (not an
OverflowError) through evaluation, comparison and plots; an evaluation that scores nothing says so on the
console; eval settings and compare options that name what the command would not produce are refused."""

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from cli_runs import load_script
from omegaconf import OmegaConf
from result_runs import corpus, eval_config, evaluate, fake_run  # noqa: F401  (corpus: a fixture)

from core.errors import PosGPTError
from data import TokenArray
from evaluation.extrapolation import perplexity, score_windows, window_plan
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import format_table
from evaluation.results import format_estimate, row_ppl
from evaluation.run import EVAL_DIR
from evaluation.stats import Estimate, clearly_different, mean_ci
from experiment.eval_checks import check_eval_settings
from model.pe.learned import LearnedConfig
from reports.perplexity import entries_of, markdown_report, ppl_series
from reports.runs import group_by_seed

compare = load_script("compare")
CPU = torch.device("cpu")


class ConstantLoss(torch.nn.Module):
    """A model whose loss is ``loss`` nats on every target: a diverged one, for large values."""

    def __init__(self, loss: float) -> None:
        super().__init__()
        self.loss = loss

    def forward(self, x, y, reduction="none", score_from=0):
        return torch.where(y[:, score_from:] != -100, self.loss, 0.0)


def test_a_loss_too_large_for_its_perplexity_gives_inf_with_a_reason(corpus):  # noqa: F811
    assert perplexity(2.0) == math.exp(2.0) and perplexity(800.0) == math.inf
    result = score_windows(
        ConstantLoss(800.0), corpus["val"], window_plan(8, 64, 8, "nonoverlapping"), 256, CPU, torch.float32
    )
    assert result["loss"] == pytest.approx(800.0) and result["ppl"] is None  # JSON holds no inf
    assert "too large for a float" in result["reason"] and row_ppl(result) == math.inf
    nan = score_windows(
        ConstantLoss(math.nan), corpus["val"], window_plan(8, 64, 8, "nonoverlapping"), 256, CPU, torch.float32
    )
    assert nan["loss"] is None and nan["reason"] == "the loss is not finite" and row_ppl(nan) is None


def diverge(model) -> None:
    """Logits ~1e4 times too large: a finite loss of thousands of nats (exp of it overflows a float)."""
    with torch.no_grad():
        model.ln_f.weight.mul_(1e4)


def test_evaluating_a_diverged_model_reports_inf_and_writes_everything(corpus, tmp_path, capsys):  # noqa: F811
    document = evaluate(corpus["val"], tmp_path, prepare=diverge)
    for row in document["results"]:
        assert row["ppl"] is None and row["loss"] > 710 and "too large for a float" in row["reason"]
    assert format_table(document, PERPLEXITY_ROWS).splitlines()[1].split() == ["nonoverlapping", "inf", "inf"]
    with open(tmp_path / EVAL_DIR / "extrapolation.csv") as f:
        assert {line["ppl"] for line in csv.DictReader(f)} == {"inf"}
    for name in ("ppl_vs_length.png", "per_position.png"):
        assert (tmp_path / EVAL_DIR / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "nothing could be scored" not in capsys.readouterr().out  # scored: its perplexity is inf


def test_a_mean_with_an_inf_member_is_inf_without_an_interval():
    estimate = mean_ci([10.0, math.inf, 12.0])
    assert estimate == Estimate(math.inf, math.inf, 3) and (estimate.low, estimate.high) == (-math.inf, math.inf)
    assert format_estimate(estimate, 3) == "inf" and format_estimate(mean_ci([math.inf]), 3) == "inf (n=1)"
    assert not clearly_different(estimate, mean_ci([1.0, 1.1, 1.2]))  # unbounded: never a claimed difference


def test_compare_with_a_diverged_seed_shows_inf_and_goes_on(tmp_path):
    runs = [fake_run("rope", 1, 10.0), fake_run("rope", 2, 12.0), fake_run("alibi", 1, 11.0)]
    diverged = fake_run("alibi", 2, None)
    diverged.document["results"][0].update(loss=900.0, reason="perplexity exp(900) is too large for a float: inf")
    entries = entries_of(group_by_seed(runs + [diverged]), "nonoverlapping", None, "d")
    report = markdown_report(entries, "nonoverlapping", None, "d", ratios=False)
    assert "| alibi | 2 | inf |" in report and "| rope | 2 | **11.00 ± 12.71** |" in report
    assert "| alibi | +inf% ± inf% |" in report  # paired with rope: unbounded, so never bold (never "clearly")
    series = ppl_series(entries)
    assert [line.y for line in series] == [[11.0], []]  # inf cannot be drawn: left out of the line


def test_an_evaluation_that_scores_nothing_says_so_on_the_console(corpus, tmp_path, capsys):  # noqa: F811
    cfg = eval_config(LearnedConfig(), lengths=[16, 32], per_position_plot_lengths=[16])  # its table holds 8
    document = evaluate(corpus["val"], tmp_path / "learned", cfg)
    printed = capsys.readouterr().out
    assert all(row["ppl"] is None for row in document["results"])
    assert "eval: nothing could be scored on tiny (val split, " in printed
    assert "at the shortest length, 16: pe=learned encodes at most 8 positions" in printed
    assert "eval: per_position.png has no line at lengths [16]: nothing was scored there" in printed
    val = corpus["val"]
    short = TokenArray(val.shards, val.start, val.start + 12, "val", val.checksums)  # shorter than 2 x 8
    evaluate(short, tmp_path / "short")
    assert "eval: nothing could be scored on tiny (val split, 12 tokens); at the shortest length, 8: needs 2x8" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "eval_keys, message",
    [
        ({"per_position_plot_lengths": [24]}, "eval.per_position_plot_lengths names [24], which are not evaluated"),
        ({"stride": 4}, "eval.stride=4 is the sliding protocol's stride, but eval.protocols=['nonoverlapping']"),
        ({"lengths": [8, 128]}, "evaluation lengths [128] exceed eval.max_tokens=64"),
    ],
)
def test_eval_settings_that_cannot_be_produced_are_refused(eval_keys, message):
    with pytest.raises(PosGPTError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_eval_settings(eval_config(**eval_keys))
    check_eval_settings(eval_config(protocols=["sliding"], stride=4, per_position_plot_lengths=[16]))


def write_run(run_dir: Path, run) -> Path:
    """A run directory holding a hand-made run's results and config, as export_results.py leaves them."""
    (run_dir / "eval").mkdir(parents=True)
    document = {**run.document, "step": 1, "config": run.config}
    (run_dir / "eval" / "extrapolation.json").write_text(json.dumps(document))
    return run_dir


@pytest.mark.parametrize(
    "options, message",
    [
        (["--stride", "4"], "--stride is the sliding protocol's; pass --protocol sliding or drop --stride 4"),
        (["--per-position", "pp.png"], "--per-position: no run has a scored row to draw"),
        (["--ratios"], "--ratios: no run was evaluated both at its training length and beyond it"),
    ],
)
def test_compare_refuses_options_it_cannot_fill(tmp_path, capsys, monkeypatch, options, message):
    run = fake_run("rope", 1, None)  # evaluated at 16, its training length, and not scorable there
    run.document["results"][0].update(tokens=0, target_range=None, reason="no")
    run.config = OmegaConf.to_container(eval_config(), resolve=True)
    run.config["train"]["seq_len"], run.document["train_seq_len"] = 16, 16
    run_dir = write_run(tmp_path / "rope-s1", run)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        compare.main([str(run_dir), *options])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "comparison.md").exists()
