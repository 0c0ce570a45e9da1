"""Key-token perplexity (LongPPL, evaluation/key_tokens.py): the selection against brute force (every target
predicted from explicit windows, as tests/evaluation/test_extrapolation.py does), the thresholds at their edges,
another run as the evaluator, the rows pooled over seeds by scripts/compare.py, and eval.py's option end to end."""

import csv
import json
import math
import re

import numpy as np
import pytest
import torch
from cli_runs import assert_one_line_error, load_script
from omegaconf import OmegaConf
from protocol_cases import Tokens, brute_force, tiny
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from data import DataConfig
from evaluation.context import EvalContext
from evaluation.evaluators.key_tokens import KeyTokens
from evaluation.extrapolation import effective_stride, target_losses, window_plan
from evaluation.key_tokens import find_key_tokens, select_key_tokens
from evaluation.results import KEY_TOKENS
from experiment.build import load_trained_run, open_trained_model
from experiment.compose import compose_config
from experiment.config import Config, EvalConfig, LoggingConfig, TrainConfig, WandbConfig, validate
from experiment.plan import evaluation_plan
from model import ModelConfig
from model.pe.rope import RoPEConfig
from reports.key_tokens import key_token_entries, key_token_report
from reports.perplexity import entries_of, ppl_estimate
from reports.runs import Run, group_by_seed

CPU = torch.device("cpu")
compare = load_script("compare")


def context(model, train_len=8, **eval_keys):
    """The EvalContext of ``model`` with key tokens on and ``eval_keys``."""
    settings = {"max_tokens": 64, "batch_tokens": 256, "key_tokens": True, **eval_keys}
    cfg = OmegaConf.structured(
        Config(
            model=ModelConfig(n_layer=2, n_head=2, n_embd=16),
            pe=RoPEConfig(),
            data=DataConfig(name="t"),
            train=TrainConfig(seq_len=train_len),
            eval=EvalConfig(**settings),
            logging=LoggingConfig(progress=False, wandb=WandbConfig(mode="disabled")),
        )
    )
    return with_settings(evaluation_plan(cfg).context(model, "/nonexistent", CPU, torch.float32, {}, 0), cfg)


def with_settings(ctx: EvalContext, cfg) -> EvalContext:
    """``ctx`` holding the key-token evaluator's settings of ``cfg`` (as ``key_settings``), for the calls below."""
    ctx.key_settings = KeyTokens.of(cfg.eval).settings
    return ctx


def spread_model():
    """A tiny model with large random weights: its losses move by whole nats with the context, so thresholds of
    a fraction of a nat select some targets and not others."""
    model = tiny("rope")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.6)
    return model


def window_context(t, first, n, length, stride):
    """The tokens target t is predicted from when windows of ``length`` score blocks of ``stride`` targets from
    ``first`` (a window ends at its block's last target); nonoverlapping windows are blocks of ``length`` each
    predicted from its own start."""
    if stride is None:
        return (t - first) % length + 1
    block_stop = min(first + ((t - first) // stride + 1) * stride, first + n)
    return length + 1 - (block_stop - t)


@pytest.mark.parametrize("protocol, stride", [("nonoverlapping", None), ("sliding", 3)])
def test_the_key_tokens_and_their_perplexity_equal_brute_force(protocol, stride):
    """Every target's long- and short-context losses from one forward of its explicit context; the key tokens are
    the candidates (long context longer than the short one) with LSD > α and LCL > β, and the row's perplexity is
    exp of their mean long-context loss."""
    model, tokens, alpha, beta = spread_model(), Tokens(400), 0.25, -6.8
    ctx = context(
        model,
        lengths=[8, 16, 32],
        protocols=[protocol],
        stride=stride,
        key_short_stride=3,
        key_lsd_threshold=alpha,
        key_lcl_threshold=beta,
    )
    selection = find_key_tokens(ctx, tokens, ctx.key_settings)
    rows = {row["length"]: row for row in selection.rows(ctx, tokens, ctx.key_settings)}
    first, n = 32, 64  # the longest length, and N its largest multiple within max_tokens
    assert sorted(rows) == [16, 32]  # only lengths longer than the short context (train.seq_len 8)
    for length, row in rows.items():
        long_stride = effective_stride(length, stride) if protocol == "sliding" else None
        targets = range(first, first + n)
        long_n = [window_context(t, first, n, length, long_stride) for t in targets]
        short_n = [window_context(t, first, n, 8, 3) for t in targets]
        long = np.array(brute_force(model, tokens, list(zip(targets, long_n))))
        short = np.array(brute_force(model, tokens, list(zip(targets, short_n))))
        candidate = np.array(long_n) > np.array(short_n)
        lsd, lcl = short - long, -long
        expected = candidate & (lsd > alpha) & (lcl > beta)
        clear = (np.abs(lsd - alpha) > 1e-4) & (np.abs(lcl - beta) > 1e-4)  # float noise cannot flip these
        mask = selection.sets[(length, protocol)].mask
        assert clear.mean() > 0.9 and (mask == expected)[clear].all()
        # both thresholds bind: a candidate left out by each alone
        assert (candidate & (lsd > alpha) & (lcl <= beta)).any() and (candidate & (lsd <= alpha) & (lcl > beta)).any()
        assert row["tokens"] == mask.sum() > 0 and row["key_candidates"] == candidate.sum()
        assert row["key_share"] == pytest.approx(mask.sum() / n)
        assert row["loss"] == pytest.approx(long[mask].mean(), rel=1e-5)
        assert row["ppl"] == pytest.approx(math.exp(long[mask].mean()), rel=1e-5)
        assert row["target_range"] == [first, first + n] and row["measure"] == KEY_TOKENS


def test_target_losses_are_the_losses_a_protocol_row_averages():
    model, tokens = spread_model(), Tokens(400)
    plan = window_plan(32, 64, 16, "sliding", 5)
    losses, contexts = target_losses(model, tokens, plan, 256, CPU, torch.float32)
    pairs = [(t, window_context(t, 32, 64, 16, 5)) for t in range(32, 96)]
    assert contexts.tolist() == [n for _, n in pairs]
    assert losses == pytest.approx(brute_force(model, tokens, pairs), rel=1e-5)


def test_thresholds_are_strict_and_a_target_without_far_context_is_never_key():
    """LSD exactly α and LCL exactly β are not key (the paper's strict inequalities); a context no longer than
    the short one is not key whatever its numbers say; a loss that is not finite selects nothing."""
    long_loss = np.array([1.0, 1.0, 2.0, 1.999, 1.0, 1.0, np.nan, np.inf])
    short_loss = np.array([3.0, 3.001, 4.5, 4.5, 9.0, 9.0, 9.0, 9.0])
    long_context = np.array([40, 40, 40, 40, 40, 16, 40, 40])
    short_context = np.full(8, 16)
    mask = select_key_tokens(long_loss, long_context, short_loss, short_context, 2.0, -2.0)
    assert mask.tolist() == [False, True, False, True, True, False, False, False]
    # α = 0 takes any gain; a very low β leaves LSD alone
    assert select_key_tokens(np.array([5.0]), np.array([9]), np.array([5.001]), np.array([8]), 0.0, -1e9).all()


@pytest.mark.parametrize(
    "override, message",
    [
        ("eval.key_lsd_threshold=-0.5", "eval.key_lsd_threshold=-0.5 is out of its domain [0, inf)"),
        ("eval.key_lcl_threshold=0", "eval.key_lcl_threshold=0.0 is out of its domain (-inf, 0)"),
        ("eval.key_short_length=0", "eval.key_short_length=0 is out of its domain [1, inf)"),
    ],
)
def test_thresholds_outside_their_domain_are_refused(override, message):
    with pytest.raises(PosGPTError, match=re.escape(message)):
        validate(compose_config(["eval.key_tokens=true", override]))
    validate(compose_config(["eval.key_tokens=true", "eval.key_lsd_threshold=0", "eval.key_lcl_threshold=-0.01"]))


def test_no_key_token_is_a_row_without_perplexity_that_says_so():
    model, tokens = spread_model(), Tokens(400)
    ctx = context(model, lengths=[8, 32], protocols=["nonoverlapping"], key_lsd_threshold=1e6)
    (row,) = find_key_tokens(ctx, tokens, ctx.key_settings).rows(ctx, tokens, ctx.key_settings)
    assert row["tokens"] == 0 and row["ppl"] is None and row["key_share"] == 0.0
    assert row["reason"].startswith("no key tokens among the") and row["key_candidates"] > 0


def test_another_run_as_evaluator_selects_what_that_run_selects_for_itself(cli, tmp_path):
    """eval.key_evaluator=<run>: the key tokens are the ones that run selects as its own evaluator, scored with
    the evaluated run's model; the rows record the evaluator and its step."""
    scored, other = (make_run(tmp_path / name, cli.corpus, "pe=rope", seed=seed) for name, seed in (("a", 1), ("b", 2)))
    keys = ["eval.key_tokens=true", "eval.key_lsd_threshold=0", "eval.key_lcl_threshold=-100", "eval.lengths=[16,32]"]
    keys += ["eval.protocols=[nonoverlapping]", "eval.max_tokens=64", "logging.progress=false"]
    tokens = Tokens(400)

    def selection_of(run_dir, *extra):
        run = load_trained_run(run_dir, [*keys, *extra], "eval.py")
        ctx = evaluation_plan(run.cfg).context(
            run.model, run_dir, CPU, torch.float32, {}, 0, open_run=open_trained_model
        )
        ctx = with_settings(ctx, run.cfg)
        return ctx, find_key_tokens(ctx, tokens, ctx.key_settings)

    ctx, by_other = selection_of(scored, f"eval.key_evaluator={other}")
    _, own = selection_of(scored)
    _, others_own = selection_of(other)
    job = (32, "nonoverlapping")
    assert (by_other.sets[job].mask == others_own.sets[job].mask).all()
    assert (by_other.sets[job].mask != own.sets[job].mask).any()
    (row,) = by_other.rows(ctx, tokens, ctx.key_settings)
    assert row["key_evaluator"] == str(other.resolve()) and row["key_evaluator_step"] == 0
    scored_losses, _ = target_losses(ctx.model, tokens, window_plan(32, 64, 32, "nonoverlapping"), 256, CPU, ctx.dtype)
    assert row["loss"] == pytest.approx(scored_losses[by_other.sets[job].mask].mean(), rel=1e-6)


def key_run(pe, seed, rows_by_length, train_len=16):
    """A run whose results hold a plain perplexity row and a key-token row per length (scripts/compare.py reads
    nothing else of it)."""
    config = {"pe": {"name": pe}, "train": {"seed": seed, "seq_len": train_len}, "model": {"n_layer": 1}}
    common = {"protocol": "nonoverlapping", "stride": None, "data": "d", "target_range": [64, 128]}
    rows = []
    for length, (ppl, key_ppl, share) in rows_by_length.items():
        rows.append({**common, "length": length, "ppl": ppl, "tokens": 64})
        selection = {"key_short_length": 16, "key_short_stride": 4, "key_lsd_threshold": 2.0}
        selection |= {"key_lcl_threshold": -2.0, "key_evaluator": "self", "key_evaluator_step": None}
        key = {"measure": KEY_TOKENS, "ppl": key_ppl, "tokens": round(64 * share), "key_share": share, **selection}
        rows.append({**common, "length": length, **key})
    document = {"pe": pe, "train_seq_len": train_len, "step": 10, "results": rows}
    return Run(f"/runs/{pe}-{seed}", document, config)


def test_compare_pools_key_token_rows_over_seeds_in_a_table_of_their_own():
    runs = [
        key_run("rope", 1, {16: (10.0, 3.0, 0.05), 32: (12.0, 4.0, 0.10)}),
        key_run("rope", 2, {16: (11.0, 3.5, 0.07), 32: (13.0, 5.0, 0.12)}),
        key_run("rope", 3, {16: (12.0, 4.0, 0.06), 32: (14.0, 6.0, 0.08)}),
        key_run("alibi", 1, {16: (9.0, 2.0, 0.02), 32: (9.5, 2.5, 0.03)}),
    ]
    groups = group_by_seed(runs)
    plain = entries_of(groups, "nonoverlapping", None, "d")
    assert ppl_estimate(plain[0], 32).mean == pytest.approx(13.0)  # key rows are not perplexity rows
    entries = key_token_entries(groups, "nonoverlapping", None, "d")
    assert [entry.label for entry in entries] == ["rope", "alibi"]  # the one selection, named in the heading
    assert ppl_estimate(entries[0], 32).mean == pytest.approx(5.0) and len(entries[0].per_seed) == 3
    report = key_token_report(entries, "nonoverlapping")
    assert "## Key-token perplexity (LongPPL, nonoverlapping protocol)" in report
    assert "key tokens (α=2, β=-2, short 16/4)" in report and "Evaluator self" in report
    line = next(line for line in report.splitlines() if line.startswith("| rope | 3 |"))
    assert line == f"| rope | 3 | {format_cell([3.0, 3.5, 4.0])} | {format_cell([4.0, 5.0, 6.0])} |"
    share = [line for line in report.splitlines() if line.startswith("| rope | 3 |")][-1]
    # the share in % of the targets, the most in bold
    assert share == f"| rope | 3 | **{format_cell([5.0, 7.0, 6.0], 1)}** | **{format_cell([10.0, 12.0, 8.0], 1)}** |"
    # seed 1 also selected with another α: another entry, never pooled, labelled by its selection
    rows = runs[0].document["results"]
    rows += [{**row, "key_lsd_threshold": 1.0, "ppl": 9.0} for row in rows if row.get("measure")]
    other = key_token_entries(group_by_seed(runs), "nonoverlapping", None, "d")
    labels = [entry.label for entry in other]
    assert len(other) == 3 and "rope key tokens (α=1, β=-2, short 16/4)" in labels
    assert ppl_estimate(other[labels.index("rope key tokens (α=2, β=-2, short 16/4)")], 32).mean == pytest.approx(5.0)


def test_key_token_rows_of_other_training_lengths_say_so_and_pair_against_the_baseline_named():
    runs = [key_run("rope", seed, {16: (10.0, 3.0 + seed, 0.05), 32: (12.0, 4.0 + seed, 0.1)}) for seed in (1, 2, 3)]
    # alibi, trained at 32: 0.8 and 0.5 of rope's key-token perplexity in every seed
    alibi = [{16: (9.0, 0.8 * (3 + s), 0.02), 32: (9.5, 0.5 * (4 + s), 0.03)} for s in (1, 2, 3)]
    runs += [key_run("alibi", seed, rows, train_len=32) for seed, rows in enumerate(alibi, 1)]
    entries = key_token_entries(group_by_seed(runs), "nonoverlapping", None, "d")
    report = key_token_report(entries, "nonoverlapping", "rope")
    assert "| rope (trained at 16) | baseline | baseline |" in report
    assert "| alibi (trained at 32) | **-20.0% ± 0.0%** | **-50.0% ± 0.0%** |" in report


def format_cell(values, digits=2):
    from evaluation.results import format_estimate
    from evaluation.stats import mean_ci

    return format_estimate(mean_ci(values), len(values), digits)


@pytest.mark.slow  # runs a command on a trained run
def test_eval_py_key_tokens_end_to_end_and_compare_over_seeds(cli, tmp_path):
    """``python eval.py run_dir=... eval.key_tokens=true``: key-token rows beside the perplexity rows, in the JSON,
    the CSV and the console; a second seed (in this process) and compare.py pool them."""
    options = ["eval.key_tokens=true", "eval.key_lsd_threshold=0", "eval.key_lcl_threshold=-100"]
    options += ["eval.lengths=[16,32]", "eval.protocols=[nonoverlapping]", "eval.max_tokens=256"]
    runs = [
        make_run(tmp_path / f"run-s{seed}", cli.corpus, "pe=rope", f"train.seed={seed}", seed=seed) for seed in (1, 2)
    ]
    done = cli.eval(runs[0], *options)
    assert done.returncode == 0, done.stderr
    assert "eval: key tokens (LSD > 0, LCL > -100; short context 13-16 tokens; evaluator self)" in done.stdout
    assert "nonoverlapping key tokens (α=0, β=-100, short 16/4)" in done.stdout
    assert cli.eval_here(runs[1], *options).returncode == 0
    rows = json.loads((runs[0] / "eval" / "extrapolation.json").read_text())["results"]
    key_rows = [row for row in rows if row.get("measure") == KEY_TOKENS]
    assert [row["length"] for row in key_rows] == [32] and len(rows) == 3
    assert key_rows[0]["tokens"] > 0 and key_rows[0]["key_evaluator"] == "self"
    with open(runs[0] / "eval" / "extrapolation.csv") as f:
        assert [line["measure"] for line in csv.DictReader(f)] == ["", "", KEY_TOKENS]
    compare.main([*map(str, runs), "--markdown", str(tmp_path / "c.md")])
    report = (tmp_path / "c.md").read_text()
    assert "## Key-token perplexity" in report and "| rope | 2 |" in report.split("## Key-token")[1]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["eval.key_tokens=true", "eval.lengths=[8,16]"], "an evaluation length longer than its short context of 16"),
        (["eval.key_tokens=true", "eval.protocols=[streaming]", "eval.lengths=[32]"], "has neither: add one"),
        (["eval.key_evaluator=/nowhere"], "is read only when eval.key_tokens=true"),
        (["eval.key_tokens=true", "eval.key_evaluator=/nowhere"], "is not a training run directory"),
        (["eval.key_tokens=true", "eval.key_short_stride=20"], "exceeds the short context of 16 tokens"),
        (["eval.key_lsd_threshold=1"], "is read only when eval.key_tokens=true"),
    ],
)
def test_what_cannot_produce_key_tokens_is_refused_in_one_line(cli, tmp_path, extra, fragment):
    run_dir = make_run(tmp_path / "run", cli.corpus)
    assert_one_line_error(cli.eval_here(run_dir, *extra), fragment)
