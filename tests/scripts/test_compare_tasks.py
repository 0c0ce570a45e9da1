"""scripts/compare.py on task results (eval/tasks.json), study.sh's task study, and sample.py's refusal of a task
run. The fast tests write runs' results with evaluation/task_accuracy.py's own writer (rows as evaluate_task and the
copy probe make them), without training; the slow one runs the task study end to end on tiny runs."""

from __future__ import annotations

import copy
import csv
import functools
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from cli_runs import REPO, assert_one_line_error, load_script
from omegaconf import DictConfig, OmegaConf
from tiny_checkpoint import make_run

from evaluation.context import variation_fields
from evaluation.evaluators.task_accuracy import with_effective_lengths
from evaluation.perplexity_format import PERPLEXITY_ROWS
from evaluation.render import write_csv
from evaluation.store import load_document, merge_documents, new_document, write_document
from evaluation.task_accuracy import TASK_ROWS, wilson_interval
from experiment.compose import compose_config
from experiment.plan import evaluation_plan
from experiment.settings import trained_config
from reports.runs import load_runs
from reports.task_tables import task_entries, task_panels

compare = load_script("compare")


def task_row(task: str, length: int, accuracy: float | None, n: int = 100, **fields) -> dict:
    """A row as evaluate_task writes it (fields: depth, variation, the copy probe's distance and measures)."""
    row = {
        "task": task,
        "length": length,
        "depth": None,
        **variation_fields("", {}, config(1).model.attn_temperature),
        "seed": 0,
    }
    row["split"] = "held-out"
    row.update(fields)
    if accuracy is None:  # as past a learned table
        return {**row, "accuracy": None, "n": 0, "reason": "pe=learned encodes at most 16 positions"}
    correct = round(accuracy * n)
    low, high = wilson_interval(correct, n)
    return {**row, "accuracy": correct / n, "ci_low": low, "ci_high": high, "correct": correct, "n": n}


@functools.cache
def composed(*overrides: str) -> DictConfig:
    return compose_config(["train.seq_len=16", *overrides])


def config(seed: int, *overrides: str) -> DictConfig:
    """The config train.py composes from ``overrides``, with train.seed = ``seed``."""
    cfg = copy.deepcopy(composed(*overrides))
    cfg.train.seed = seed
    return cfg


def write(cfg: DictConfig, task: str, rows: list[dict], extra: dict, run_dir: Path, step: int | None = None) -> None:
    """tasks.json and tasks.csv as the evaluation writes them (evaluation/run.py's store_rows); its plots (not
    compare's input) left out."""
    trained = OmegaConf.to_container(cfg, resolve=True)
    context = evaluation_plan(cfg).context(
        None, run_dir, torch.device("cpu"), torch.float32, trained, step
    )  # no model: written
    evaluator = "copy_probe" if task == "copy_probe" else "task_accuracy"
    rows = [context.provenance(row, evaluator, {}) for row in rows]
    header = {"pe": cfg.pe.name, "train_seq_len": cfg.train.seq_len, "step": context.step, "task": task, **extra}
    new = new_document({**header, "config": trained}, rows)
    document, _ = merge_documents(load_document(run_dir / "eval", TASK_ROWS), new, TASK_ROWS)
    document = with_effective_lengths(document, cfg.eval.task_threshold)
    write_document(document, run_dir / "eval", TASK_ROWS)
    write_csv(document, run_dir / "eval" / TASK_ROWS.csv_file, TASK_ROWS)


def task_run(
    root: Path, pe: str, seed: int, accuracy: dict[int, float | None], *overrides: str, rows=(), step=None
) -> Path:
    """<root>/<task>-<pe>[-<overrides>]-s<seed> with the eval/tasks.json a task run of these settings writes
    (scoring the checkpoint of ``step``; None: the last)."""
    cfg = config(seed, f"pe={pe}", "task=passkey", *overrides)
    name = "-".join([cfg.task.name, pe, *(o.split("=")[-1] for o in overrides if o.startswith("task."))])
    run_dir = root / f"{name}-s{seed}"
    results = [task_row(cfg.task.name, length, value) for length, value in accuracy.items()] + list(rows)
    write(cfg, cfg.task.name, results, {"task_config": OmegaConf.to_container(cfg.task)}, run_dir, step)
    return run_dir


def test_checkpoints_of_other_steps_are_other_settings(tmp_path):
    """Step checkpoints of the same runs (eval.py on copies of step_N.pt) are tables' rows of their own, labelled
    by the step, never pooled as seeds nor refused as the same run twice."""
    last = config(1, "task=passkey").train.max_steps
    runs = [task_run(tmp_path / "last", "rope", seed, {16: 0.9}) for seed in (1, 2)]
    runs += [task_run(tmp_path / "early", "rope", seed, {16: 0.2 * seed}, step=100) for seed in (1, 2)]
    report = report_of(runs, tmp_path)
    assert f"| rope step={last} | 2 | **0.900 ± 0.000** |" in report
    assert "| rope step=100 | 2 | 0.300 ± 1.271 |" in report


def test_a_run_whose_files_scored_other_checkpoints_is_refused(tmp_path, capsys):
    run_dir = language_run(tmp_path, "rope", 1, 10.0, {(16, 4): (0.5, -1.0)})
    document = json.loads((run_dir / "eval" / "tasks.json").read_text())
    (run_dir / "eval" / "tasks.json").write_text(json.dumps({**document, "step": 20}))
    with pytest.raises(SystemExit) as exited:
        compare.main([str(run_dir), "--markdown", str(tmp_path / "c.md")])
    assert exited.value.code == 2
    assert "its perplexity scored the checkpoint of step 10, its tasks.json that of step 20" in capsys.readouterr().err


def language_run(
    root: Path, pe: str, seed: int, ppl: float, probe: dict[tuple[int, int], tuple[float, ...]], span: int = 4
) -> Path:
    """A language-model run: its extrapolation.json (one length) and its copy probe's rows in tasks.json,
    probe: {(length, distance): (accuracy, mean_logprob[, copy_gain])} (a run evaluated again: its rows added)."""
    cfg = config(seed, f"pe={pe}", "data=text")
    run_dir, trained = root / f"{pe}-s{seed}", OmegaConf.to_container(cfg, resolve=True)
    row = {
        "length": 16,
        "protocol": "nonoverlapping",
        "stride": None,
        **variation_fields("", {}, cfg.model.attn_temperature),
        "data": "text",
    }
    row.update(split="val", ppl=ppl, loss=1.0, tokens=64, target_range=[16, 80])
    write_document(
        new_document({"pe": pe, "train_seq_len": 16, "step": 10, "data": "text", "config": trained}, [row]),
        run_dir / "eval",
        PERPLEXITY_ROWS,
    )
    text = {"data": "text", "corpus": "files x.txt", "split": "val", "copy_span": span}
    rows = [
        task_row("copy_probe", length, accuracy, distance=distance, mean_logprob=logprob, **text, **measures)
        for (length, distance), (accuracy, logprob, *gain) in probe.items()
        for measures in [{"copy_gain": gain[0]} if gain else {}]
    ]
    write(cfg, "copy_probe", rows, {"copy_span": span}, run_dir, step=10)  # the checkpoint the perplexity scored
    return run_dir


def report_of(runs: list[Path], tmp_path: Path, *options: str) -> str:
    compare.main([*map(str, runs), "--markdown", str(tmp_path / "c.md"), *options])
    return (tmp_path / "c.md").read_text()


@pytest.fixture(scope="module")
def three_seeds(tmp_path_factory) -> list[Path]:
    """passkey, rope and alibi, seeds 1-3: rope 0.9, 0.8, 0.7 at 16, alibi 0.85, 0.65, 0.45; rope is n/a at 64."""
    root = tmp_path_factory.mktemp("tasks")
    rope = [(0.9, 0.5), (0.8, 0.4), (0.7, 0.3)]
    alibi = [(0.85, 0.6), (0.65, 0.5), (0.45, 0.4)]
    depth = [task_row("passkey", 16, 1.0, depth=0.5)]
    runs = [task_run(root, "rope", s, {16: a, 32: b, 64: None}, rows=depth) for s, (a, b) in enumerate(rope, 1)]
    runs += [task_run(root, "alibi", s, {16: a, 32: b, 64: 0.1}) for s, (a, b) in enumerate(alibi, 1)]
    return runs


def test_cells_are_the_mean_and_t_interval_over_seeds_per_task_and_cell(three_seeds, tmp_path):
    report = report_of(three_seeds, tmp_path)
    assert report.startswith("## Task: passkey (filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform)\n")
    # rope at 16: mean 0.8, s = 0.1, half-width t(0.975, 2) * 0.1 / sqrt(3) = 0.248; alibi: s = 0.2
    assert "| rope | 3 | **0.800 ± 0.248** | 0.400 ± 0.248 | n/a |" in report
    assert "| alibi | 3 | 0.650 ± 0.497 | **0.500 ± 0.248** | **0.100 ± 0.000** |" in report
    # the depth grid is its own table: rope alone has rows there, never averaged with random depth
    assert "random depth:" in report and "depth 0.5:" in report
    depth_table = report.split("depth 0.5:")[1]
    assert "| setting | seeds | 16 (1×) |\n" in depth_table and "| rope | 3 | **1.000 ± 0.000** |" in depth_table
    assert "Differences" not in depth_table  # one setting: nothing to compare
    assert "- 16 (1×): highest rope; intervals apart (clearly worse): no setting; intervals overlap" in report
    assert (
        "accuracy ≥ 0.9 at every evaluated length; per seed, - where the shortest is below it): rope: 16, -, -; "
        "alibi: -, -, -." in report
    )  # rope seed 1: 0.9 at 16, 0.5 at 32
    # paired by seed: alibi − rope at 16 is −0.05, −0.15, −0.25: mean −0.15, s 0.1
    # at 32 alibi is the highest: rope − alibi is −0.1 for every seed, an interval of width 0 that excludes 0
    assert "| alibi | -0.150 ± 0.248 | highest | - |" in report  # the interval includes 0: not bold
    assert "| rope | highest | **-0.100 ± 0.000** | - |" in report
    assert "- 32 (2×): highest alibi; interval excludes 0 (clearly different): rope;" in report
    assert not (tmp_path / "c.png").exists()  # no perplexity to draw
    assert (tmp_path / "c_tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_paired_differences_against_a_baseline(three_seeds, tmp_path):
    report = report_of(three_seeds, tmp_path, "--baseline", "alibi")
    paired = report.split("random depth:")[1].split("depth 0.5:")[0]
    assert "| alibi | baseline | baseline | - |" in paired
    assert "| rope | +0.150 ± 0.248 | **-0.100 ± 0.000** | - |" in paired
    assert "a setting's value − the baseline's (alibi) value" in paired
    with pytest.raises(SystemExit) as exit_info:
        report_of(three_seeds, tmp_path, "--baseline", "nosuch")
    assert exit_info.value.code == 2


def test_a_baseline_trained_at_another_length_is_the_one_paired_against(tmp_path):
    """Settings trained at other lengths are labelled by them in the tables ("... (trained at 16)"); --baseline names
    the setting as given, and the paired table is against it, not the highest; a baseline of one seed is refused."""
    runs = [task_run(tmp_path, "rope", seed, {16: 1.0, 32: 0.2 + seed / 10}) for seed in (1, 2, 3)]
    for seed in (1, 2, 3):  # alibi trained at 32: 0.4 above rope at 32 in every seed
        cfg = config(seed, "pe=alibi", "task=passkey")
        cfg.train.seq_len = 32
        rows = [task_row("passkey", 16, 1.0), task_row("passkey", 32, 0.6 + seed / 10)]
        write(cfg, "passkey", rows, {"task_config": OmegaConf.to_container(cfg.task)}, tmp_path / f"alibi-s{seed}")
        runs.append(tmp_path / f"alibi-s{seed}")
    report = report_of(runs, tmp_path, "--baseline", "rope")
    assert "| rope (trained at 16) | 3 | **1.000 ± 0.000** | 0.400 ± 0.248 |" in report
    assert "a setting's value − the baseline's (rope (trained at 16)) value" in report
    assert "| rope (trained at 16) | baseline | baseline |" in report
    assert "| alibi (trained at 32) | +0.000 ± 0.000 | **+0.400 ± 0.000** |" in report
    assert "| rope (trained at 16) | +0.000 ± 0.000 |" in report_of(runs[1:], tmp_path, "--baseline", "alibi")
    with pytest.raises(SystemExit) as exit_info:
        report_of(runs[2:], tmp_path, "--baseline", "rope")
    assert exit_info.value.code == 2


def test_default_outputs_lie_beside_the_markdown(three_seeds, tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    compare.main([*map(str, three_seeds), "--markdown", str(tmp_path / "out" / "study.md")])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "study.md",
        "study_tasks.csv",
        "study_tasks.png",
        "study_tasks_depth.png",  # rope's rows have a depth
        "study_tasks_heatmap.png",
    ]
    assert not list(elsewhere.iterdir())


def test_the_heatmap_is_a_panel_per_task_with_a_cell_per_setting_and_length(three_seeds, tmp_path, monkeypatch):
    """Settings down, lengths across, the mean over seeds printed in each cell that has one (rope is n/a at 64:
    blank), at random depth (the depth grid's rows are another table); a task of its own is a panel of its own."""
    from evaluation import plots

    drawn = {}
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: real_save(drawn.setdefault(Path(path).name, fig), path))
    mqar = [task_run(tmp_path / "mqar", "rope", seed, {16: 0.5, 32: 0.25}, "task=mqar") for seed in (1, 2)]
    report_of([*three_seeds, *mqar], tmp_path)
    assert (tmp_path / "c_tasks_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panels = [ax for ax in drawn["c_tasks_heatmap.png"].axes if ax.images]
    assert [ax.get_title(loc="left") for ax in panels] == ["passkey, random depth", "mqar"]
    passkey, task = panels
    assert [label.get_text() for label in passkey.get_yticklabels()] == ["rope", "alibi"]
    assert [label.get_text() for label in passkey.get_xticklabels()] == ["16\n1×", "32\n2×", "64\n4×"]
    assert [text.get_text() for text in passkey.texts] == ["0.80", "0.40", "0.65", "0.50", "0.10"]
    assert passkey.images[0].get_array().shape == (2, 3)
    assert [text.get_text() for text in task.texts] == ["0.50", "0.25"]
    assert drawn["c_tasks_heatmap.png"].get_suptitle() == "Exact match by evaluation length"


def test_the_task_csv_holds_every_cell_with_its_seeds(three_seeds, tmp_path):
    report_of(three_seeds, tmp_path)
    with open(tmp_path / "c_tasks.csv") as f:
        lines = list(csv.DictReader(f))
    rope16 = next(line for line in lines if line["setting"] == "rope" and line["length"] == "16" and not line["depth"])
    assert (
        rope16["task"] == "passkey"
        and rope16["task_settings"] == "filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform"
    )
    assert float(rope16["mean"]) == pytest.approx(0.8) and float(rope16["half_width"]) == pytest.approx(0.2484138)
    assert json.loads(rope16["values"]) == {"1": 0.9, "2": 0.8, "3": 0.7} and rope16["multiple"] == "1.0"
    rope64 = next(line for line in lines if line["setting"] == "rope" and line["length"] == "64")
    assert rope64["seeds"] == "0" and rope64["mean"] == ""  # not evaluable: no value, as n/a in the table
    assert {line["depth"] for line in lines} == {"", "0.5"}


def test_the_effective_context_length_is_a_section_after_every_task(three_seeds, tmp_path):
    """Per setting at random depth, each seed's longest length before accuracy first falls below 0.5 (rope: 0.5 at
    32 on seed 1 only, n/a at 64; alibi's seed 3 below 0.5 at 16 already) and below 0.9 × its 1× accuracy, mean
    over seeds ± t-interval, a seed with none counted as 0; in the CSV too, each seed's value and the threshold."""
    mqar = [task_run(tmp_path / "mqar", "rope", seed, {16: 1.0, 32: 0.45 * seed}, "task=mqar") for seed in (1, 2)]
    report = report_of([*three_seeds, *mqar], tmp_path)
    section = report.split("## Effective context length (accuracy ≥ 0.5; accuracy ≥ 0.9 × 1×)\n")[1]
    assert "## Task:" not in section  # after every task's tables: the tables the docs quote keep their numbers
    passkey, task = section.split("### mqar (")
    assert "### passkey (filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform)" in passkey
    header = "| setting | seeds | mean, accuracy ≥ 0.5 | mean, accuracy ≥ 0.9 × 1× | per seed, accuracy ≥ 0.5 |"
    assert header in passkey
    # rope: 32, 16, 16 (s = 9.24: ± 23); relative: 0.81, 0.72, 0.63 hold at 16 only. alibi: 32, 32, — (0)
    assert "| rope | 3 | **21 ± 23** | **16 ± 0** | 32, 16, 16 | 16, 16, 16 |" in passkey
    assert "| alibi | 3 | **21 ± 46** | 11 ± 23 | 32, 32, — | 16, 16, — |" in passkey
    assert "| rope | 2 | **24 ± 102** | **24 ± 102** | 16, ≥32 | 16, ≥32 |" in task  # seed 2 passes everywhere
    with open(tmp_path / "c_tasks.csv") as f:
        lines = [line for line in csv.DictReader(f) if line["measure"].startswith("effective_length")]
    rope = [line for line in lines if line["setting"] == "rope" and line["task"] == "passkey"]
    assert [(line["measure"], line["threshold"], line["length"]) for line in rope] == [
        ("effective_length_absolute", "0.5", ""),
        ("effective_length_relative", "0.9", ""),
    ]
    assert json.loads(rope[0]["values"]) == {"1": 32, "2": 16, "3": 16} and rope[0]["seeds"] == "3"
    alibi = next(line for line in lines if line["setting"] == "alibi" and line["measure"].endswith("absolute"))
    assert json.loads(alibi["values"]) == {"1": 32, "2": 32, "3": 0} and float(alibi["mean"]) == pytest.approx(64 / 3)


def test_the_effective_length_thresholds_are_options_named_in_the_heading(three_seeds, tmp_path):
    report = report_of(three_seeds, tmp_path, "--ecl-absolute", "0.3", "--ecl-relative", "0.5")
    assert "## Effective context length (accuracy ≥ 0.3; accuracy ≥ 0.5 × 1×)" in report
    assert "Absolute: accuracy ≥ 0.3 (--ecl-absolute). Relative: accuracy ≥ 0.5 × the seed's" in report
    # n/a at 64 ends it; relative: seed 3's 0.3 at 32 is below 0.5 × its 0.7 at 1×
    assert "| rope | 3 | **32 ± 0** | 27 ± 23 | 32, 32, 32 | 32, 32, 16 |" in report


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--ecl-relative", "1.5", "argument --ecl-relative: 1.5 is out of its domain (0, 1]"),
        ("--ecl-absolute", "0", "argument --ecl-absolute: 0 is out of its domain (0, 1]"),
        ("--ecl-absolute", "nan", "argument --ecl-absolute: nan is out of its domain (0, 1]"),
        ("--ecl-relative", "high", "argument --ecl-relative: 'high' is not a number"),
    ],
)
def test_a_bad_threshold_is_one_line_and_exit_2(three_seeds, tmp_path, capsys, option, value, message):
    with pytest.raises(SystemExit) as exited:
        compare.main([str(three_seeds[0]), "--markdown", str(tmp_path / "c.md"), option, value])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


def test_a_threshold_without_task_accuracy_is_refused(tmp_path, capsys):
    runs = [language_run(tmp_path, "rope", seed, 10.0, {(16, 4): (0.5, -1.0)}) for seed in (1, 2)]  # a probe: a grid
    with pytest.raises(SystemExit) as exited:
        report_of(runs, tmp_path / "out", "--ecl-relative", "0.8")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert "--ecl-relative: no task run has accuracy by length (eval/tasks.json, off any grid)" in err
    assert "## Effective context length" not in report_of(runs, tmp_path / "plain")  # and without it, no section


def test_the_depth_heatmap_is_a_panel_per_setting_with_a_depth_grid(tmp_path, monkeypatch, capsys):
    """Depths down, lengths across, the mean over seeds in each cell; a panel per task and setting whose rows have
    depths (alibi's have none: no panel), named by both, the task's settings beside; no file without depths."""
    from evaluation import plots

    drawn = {}
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: real_save(drawn.setdefault(Path(path).name, fig), path))
    runs = []
    for seed in (1, 2):
        depths = [task_row("passkey", n, 0.5 * seed * depth, depth=depth) for depth in (0.0, 1.0) for n in (16, 32)]
        runs.append(task_run(tmp_path, "rope", seed, {16: 1.0, 32: 0.5}, rows=depths))
        runs.append(task_run(tmp_path, "alibi", seed, {16: 1.0, 32: 0.5}))
    report_of(runs, tmp_path)
    printed = capsys.readouterr().out
    figure = drawn["c_tasks_depth.png"]
    assert (tmp_path / "c_tasks_depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{tmp_path / 'c_tasks_depth.png'}" in printed  # compare names it among what it wrote
    (panel,) = [ax for ax in figure.axes if ax.images]
    assert panel.get_title(loc="left") == "passkey, rope"
    assert (
        panel.get_title(loc="right").replace("\n", " ")
        == "filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform"
    )
    assert [label.get_text() for label in panel.get_yticklabels()] == ["depth 0", "depth 1"]
    assert [label.get_text() for label in panel.get_xticklabels()] == ["16\n1×", "32\n2×"]
    assert [text.get_text() for text in panel.texts] == ["0.00", "0.00", "0.75", "0.75"]  # (0.5 + 1.0) / 2 at depth 1
    assert figure.get_suptitle() == "Exact match by key depth and evaluation length"
    caption = " ".join(text.get_text() for text in figure.texts).replace("\n", " ")
    assert "row: the key's depth" in caption and "(2 a setting" in caption
    mqar = [task_run(tmp_path / "mqar", "rope", seed, {16: 1.0}, "task=mqar") for seed in (1, 2)]
    report_of(mqar, tmp_path / "none")
    assert not (tmp_path / "none" / "c_tasks_depth.png").exists()


def test_task_settings_are_never_pooled_nor_compared(tmp_path):
    """passkey with key_len 4 and 6: two tables, each of its own seeds, labelled; the same seed twice refused."""
    runs = [task_run(tmp_path, "rope", seed, {16: 0.5 + seed / 10}) for seed in (1, 2)]
    runs += [task_run(tmp_path, "rope", seed, {16: 0.1 * seed}, "task.key_len=6") for seed in (1, 2)]
    report = report_of(runs, tmp_path)
    four, six = report.split("## Task: passkey (filler_len=5, key_len=6, n_symbols=10, train_lengths=uniform)")
    assert "## Task: passkey (filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform)" in four
    assert "| rope task.key_len=4 | 2 | **0.650 ± 0.635** |" in four and "key_len=6 |" not in four
    assert "| rope task.key_len=6 | 2 | **0.150 ± 0.635** |" in six
    twice = task_run(tmp_path / "again", "rope", 1, {16: 0.2})
    with pytest.raises(SystemExit) as exit_info:
        report_of([runs[0], twice], tmp_path)
    assert exit_info.value.code == 2


def test_runs_trained_on_other_lengths_are_never_pooled_and_old_runs_read_as_fixed(tmp_path):
    """A run written before task.train_lengths existed (its task_config lacks the key) trained at fixed length: its
    table says so, apart from the runs trained on every length up to L."""
    runs = [task_run(tmp_path, "rope", seed, {16: 0.5 + seed / 10}) for seed in (1, 2)]
    old = [task_run(tmp_path / "old", "rope", seed, {16: 0.1 * seed}) for seed in (1, 2)]
    for run_dir in old:
        path = run_dir / "eval" / "tasks.json"
        document = json.loads(path.read_text())
        del document["task_config"]["train_lengths"], document["config"]["task"]["train_lengths"]
        path.write_text(json.dumps(document))
    report = report_of(runs + old, tmp_path)
    uniform, fixed = report.split("## Task: passkey (filler_len=5, key_len=4, n_symbols=10, train_lengths=fixed)")
    assert "## Task: passkey (filler_len=5, key_len=4, n_symbols=10, train_lengths=uniform)" in uniform
    assert "| 2 | **0.650 ± 0.635** |" in uniform and "| 2 | **0.150 ± 0.635** |" in fixed


def test_rows_evaluated_with_an_attention_temperature_are_rows_of_their_own(tmp_path):
    """A task run scored as trained and with model.attn_temperature.type=logn keeps both (neither replaces the
    other in tasks.json) and compare shows them as two rows, never one pooled cell."""
    logn = task_row("passkey", 16, 0.9, attn_temperature={"type": "logn"})
    runs = [task_run(tmp_path, "rope", seed, {16: 0.5}, rows=[logn]) for seed in (1, 2)]
    assert len(json.loads((runs[0] / "eval" / "tasks.json").read_text())["results"]) == 2
    report = report_of(runs, tmp_path)
    assert "| rope | 2 | 0.500 ± 0.000 |" in report and "| rope logn | 2 | **0.900 ± 0.000** |" in report
    # perplexity rows alike: the run scored again with logn adds rows beside the first, compared apart
    for seed, run_dir in enumerate(runs, start=1):
        cfg = config(seed, "pe=rope", "data=text", "model.attn_temperature.type=logn")
        row = {
            "length": 16,
            "protocol": "nonoverlapping",
            "stride": None,
            **variation_fields("", {}, cfg.model.attn_temperature),
        }
        row.update(data="text", split="val", ppl=20.0, loss=3.0, tokens=64, target_range=[16, 80])
        trained = OmegaConf.to_container(config(seed, "pe=rope", "data=text"), resolve=True)
        plain = {**row, "attn_temperature": None, "ppl": 30.0}
        step = json.loads((run_dir / "eval" / "tasks.json").read_text())["step"]  # the same checkpoint
        document = new_document(
            {"pe": "rope", "train_seq_len": 16, "step": step, "data": "text", "config": trained}, [plain, row]
        )
        write_document(document, run_dir / "eval", PERPLEXITY_ROWS)
    report = report_of(runs, tmp_path)
    assert "| rope | 2 | 30.00 ± 0.00 |" in report and "| rope logn | 2 | **20.00 ± 0.00** |" in report


def test_copy_probe_rows_aggregate_by_distance_beside_the_perplexity(tmp_path):
    probe = {1: {(16, 4): (0.5, -2.0), (16, 12): (0.25, -3.0)}, 2: {(16, 4): (0.7, -1.0), (16, 12): (0.35, -2.0)}}
    runs = [language_run(tmp_path, "rope", seed, 10.0 + seed, probe[seed]) for seed in (1, 2)]
    report = report_of(runs, tmp_path)
    perplexity, probes = report.split("## Task: copy_probe (copy_span=4, corpus=files x.txt, data=text, split=val)\n")
    # the perplexity section is what compare writes from the runs' perplexity alone
    only_ppl = tmp_path / "ppl"
    for run in runs:
        write_document(
            json.loads((run / "eval" / "extrapolation.json").read_text()), only_ppl / run.name / "eval", PERPLEXITY_ROWS
        )
    assert perplexity == report_of([only_ppl / run.name for run in runs], tmp_path / "ppl") + "\n"
    accuracy, logprob = probes.split("Mean log-probability of the answer tokens (nats) by evaluation length")
    assert "distance 4:" in accuracy and "| rope | 2 | **0.600 ± 1.271** |" in accuracy
    assert "distance 12:" in accuracy and "| rope | 2 | **0.300 ± 0.635** |" in accuracy
    assert "| rope | 2 | **-1.500 ± 6.353** |" in logprob and "| rope | 2 | **-2.500 ± 6.353** |" in logprob
    assert (tmp_path / "c.png").exists() and (tmp_path / "c_tasks.png").exists()


def test_the_task_plot_draws_the_copy_gain_beside_the_accuracy_where_rows_have_it(tmp_path):
    """A probe's accuracy is 0 for a model that copies a little: its copy_gain panel shows how much (mean over
    seeds by length, at the first distance); a task without copy_gain gets its accuracy panel alone."""
    probe = {1: {(16, 4): (0.0, -5.0, 0.2), (32, 4): (0.0, -5.0, 0.1)}, 2: {(16, 4): (0.0, -5.0, 0.4)}}
    runs = [language_run(tmp_path, "rope", seed, 10.0, probe[seed]) for seed in (1, 2)]
    panels = task_panels(task_entries(load_runs(runs, trained_config)))
    assert [(panel.name, panel.measure) for panel in panels] == [
        ("copy_probe, distance 4", "accuracy"),
        ("copy_probe, distance 4", "copy_gain"),
    ]
    (gain,) = panels[1].series
    assert gain.x == [16, 32] and gain.y == pytest.approx([0.3, 0.1])
    report_of(runs, tmp_path)
    assert (tmp_path / "c_tasks.png").exists()
    passkey = [task_run(tmp_path / "passkey", "rope", seed, {16: 1.0}) for seed in (1, 2)]
    assert [panel.measure for panel in task_panels(task_entries(load_runs(passkey, trained_config)))] == ["accuracy"]


def test_copy_probes_of_other_spans_are_other_tables(tmp_path):
    """A run probed with eval.copy_span=4 then 8 keeps both sets of rows in tasks.json: never pooled."""
    runs = [language_run(tmp_path, "rope", seed, 10.0, {(16, 4): (0.5, -1.0)}) for seed in (1, 2)]
    for seed in (1, 2):  # the same runs evaluated again: their extrapolation.json rewritten, the probe's rows added
        language_run(tmp_path, "rope", seed, 10.0, {(16, 8): (0.1 * seed, -2.0)}, span=8)
    assert len(json.loads((runs[0] / "eval" / "tasks.json").read_text())["results"]) == 2
    report = report_of(runs, tmp_path)
    four, eight = report.split("## Task: copy_probe (copy_span=8")
    assert "## Task: copy_probe (copy_span=4" in four and "distance 4:" in four and "distance 8:" not in four
    assert "distance 8:" in eight and "| rope | 2 | **0.150 ± 0.635** |" in eight


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json", "is damaged or not JSON"),
        ('{"results": []}', "is malformed: no 'pe' name or integer 'train_seq_len'"),
        ("rows", "is malformed: result at length 16 lacks a task, an integer n or numeric values"),
    ],
)
def test_a_damaged_tasks_file_is_named(three_seeds, tmp_path, capsys, text, problem):
    run_dir = tmp_path / "broken"
    (run_dir / "eval").mkdir(parents=True)
    if text == "rows":  # the right keys, values of the wrong kind
        document = json.loads((three_seeds[0] / "eval" / "tasks.json").read_text())
        document["results"][0]["accuracy"] = "high"
        text = json.dumps(document)
    (run_dir / "eval" / "tasks.json").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        report_of([three_seeds[0], run_dir], tmp_path)
    assert exit_info.value.code == 2 and f"{run_dir}/eval/tasks.json {problem}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, doing",
    [
        ("sample.py", "sampling text from it"),
        # these two fed GPT-2's ids of text to the task's vocabulary: IndexError's traceback
        ("scripts/inspect_attention.py", "inspecting its attention on text"),
        ("scripts/repeated_passages.py", "scoring text with it"),
    ],
)
def test_a_command_that_reads_text_refuses_a_task_run(cli, tmp_path, command, doing):
    run_dir = make_run(tmp_path / "passkey", cli.corpus, "task=passkey")
    args = ["halves", str(run_dir)] if command.endswith("passages.py") else [f"run_dir={run_dir}"]
    done = cli.here(command, *args)
    assert_one_line_error(done, f"{run_dir} was trained on task=passkey: {doing} means nothing")


# The task study end to end: tiny runs, few examples per cell, two lengths.
TINY_TASKS = [
    "model.n_layer=1",
    "model.n_embd=16",
    "model.n_head=2",
    "train.seq_len=32",  # mqar's 8 pairs need 32 tokens
    "train.batch_size=4",
    "train.max_steps=4",
    "train.num_threads=1",
    "train.val_batches=1",
    "logging.wandb.mode=disabled",
    "logging.progress=false",
    "eval.length_multipliers=[1,2]",
    "eval.task_half_width=0.3",
    "eval.task_depths=[]",  # no grid of depths, which only passkey has: any task reads []
]


@pytest.mark.slow
@pytest.mark.e2e
def test_the_task_study_trains_each_task_scheme_and_seed_skips_what_is_done_and_compares(tmp_path):
    study_dir = tmp_path / "study"
    env = {**os.environ, "POSGPT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}

    def study(*options: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["bash", "scripts/study.sh", *options, str(study_dir), *TINY_TASKS],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    # Two runs in all (pooling seeds is the fast tests' business, on configs composed as train.py composes them).
    study("--tasks", "passkey,mqar", "--schemes", "none", "--seed-list", "1")
    first = (study_dir / "passkey-none-s1" / "checkpoints" / "last.pt").stat().st_mtime_ns
    (study_dir / "comparison_tasks.md").unlink()
    again = study("--tasks", "passkey", "--schemes", "none", "--seed-list", "1")
    assert again.stdout.count("nothing to do") == 1
    assert (study_dir / "passkey-none-s1" / "checkpoints" / "last.pt").stat().st_mtime_ns == first
    assert {p.name for p in study_dir.iterdir() if p.is_dir()} == {"passkey-none-s1", "mqar-none-s1"}
    document = json.loads((study_dir / "mqar-none-s1" / "eval" / "tasks.json").read_text())
    assert document["config"]["model"]["n_embd"] == 16 and document["config"]["train"]["lr"] == 1e-3  # the task's
    report = (study_dir / "comparison_tasks.md").read_text()  # rewritten from every finished task run
    assert (
        "## Task: mqar (min_pairs=1, n_keys=32, n_pairs=8, n_values=32, power_a=0.01, train_lengths=uniform)" in report
        and "## Task: passkey (" in report
    )
    mqar, passkey = report.split("## Task: passkey (")
    assert "| none (NoPE) | 1 |" in mqar and "| none (NoPE) | 1 |" in passkey
    assert (study_dir / "comparison_tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (study_dir / "comparison_tasks_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (study_dir / "comparison_tasks.csv").read_text().startswith("task,task_settings,setting,depth,distance")
    assert not (study_dir / "comparison.md").exists()  # the language-model study's comparison is another's


@pytest.mark.slow
@pytest.mark.parametrize(
    "option, message",
    [
        (["--tasks", "passkey,nosuch"], "--tasks takes tasks of configs/task/"),
        (["--schemes", "rope,nosuch"], "--schemes takes schemes of configs/pe/ (alibi,cope,"),
    ],
)
def test_the_study_refuses_an_unknown_task_or_scheme(tmp_path, option, message):
    done = subprocess.run(
        ["bash", "scripts/study.sh", *option, str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_study_lists_task_runs(tmp_path):
    done = subprocess.run(
        ["bash", "scripts/study.sh", "--list", "--tasks", "passkey,mqar", "--schemes", "rope", "--seeds", "2", "d"]
        + TINY_TASKS  # a tiny model: each job's rehearsal is cheap
        + ["train.seq_len=64"],  # the tasks' own length: RoPE's study variations hold windows of 32
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.stdout.split() == ["d/passkey-rope-s1", "d/passkey-rope-s2", "d/mqar-rope-s1", "d/mqar-rope-s2"]


def test_exported_task_results_compare_as_the_runs_do(three_seeds, tmp_path):
    export = load_script("export_results")
    export.main([*map(str, three_seeds), "--to", str(tmp_path / "exported")])
    copies = [tmp_path / "exported" / run.name for run in three_seeds]
    assert all((copy / "eval" / "tasks.csv").is_file() for copy in copies)
    assert not (copies[0] / "eval" / "extrapolation.json").exists()  # a task run has none
    assert report_of(copies, tmp_path / "b") == report_of(three_seeds, tmp_path / "a")
