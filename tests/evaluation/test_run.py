"""What an evaluation leaves behind: extrapolation.json (schema, accumulation), the CSV, the plots, W&B."""

import csv
import json
import os
import re
import subprocess
import sys

import matplotlib.image
import pytest
import torch
from repo_root import REPO
from result_runs import corpus_splits, eval_config
from result_runs import evaluate as evaluate_with

from core.errors import PosGPTError
from core.tracking import init_wandb
from evaluation import plots
from evaluation.perplexity_format import PERPLEXITY_ROWS, per_position_rows
from evaluation.plots import Series, scheme_colour
from evaluation.render import format_table
from evaluation.results import CSV_COLUMNS, format_ppl
from evaluation.run import EVAL_DIR, check_evaluators
from evaluation.schemes import COLOURS
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.plan import evaluation_plan, plan_evaluators, tracker_settings
from model.pe.learned import LearnedConfig

CPU = torch.device("cpu")
ROW_KEYS = {
    "length",
    "protocol",
    "stride",
    "variation",
    "variation_settings",
    "data",
    "tokens",
    "loss",
    "ppl",
    "per_position_loss",
    "per_position_bins",
    "target_range",
    "peak_memory_mb",
    "memory_metric",
    "seconds",
}


@pytest.fixture(scope="module")
def val_tokens(tmp_path_factory):
    """The validation half of a corpus made of a few standard-library modules."""
    return corpus_splits(tmp_path_factory, "textwrap.py", "string.py", "bisect.py")["val"]


def config(pe=None, **eval_keys):
    """result_runs' tiny config evaluated at 1x, 2x and 4x under both default protocols, 256 tokens a batch."""
    defaults = {"length_multipliers": [1, 2, 4], "protocols": ["nonoverlapping", "sliding"], "batch_tokens": 256}
    return eval_config(pe, **{**defaults, **eval_keys})


def evaluate(cfg, tokens, run_dir, **context):
    return evaluate_with(tokens, run_dir, cfg, context=context)


def read_document(run_dir):
    return json.loads((run_dir / EVAL_DIR / "extrapolation.json").read_text())


def assert_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_outputs_exist_and_follow_the_schema(val_tokens, tmp_path):
    document = evaluate(config(), val_tokens, tmp_path)
    assert read_document(tmp_path) == document
    assert {k: document[k] for k in ("pe", "train_seq_len", "step", "data")} == {
        "pe": "rope",
        "train_seq_len": 8,
        "step": 5,
        "data": "tiny",
    }
    rows = document["results"]
    assert len(rows) == 3 * 2  # lengths x protocols
    for row in rows:
        assert ROW_KEYS <= row.keys()
        assert row["variation_settings"]["scaling"] == {
            "type": "none",
            "factor": 1.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "attention_factor": None,
            "original_seq_len": None,
            "low_freq_factor": None,
            "high_freq_factor": None,
            "short_factor": None,
            "long_factor": None,
        }
        assert row["tokens"] == 64 and row["ppl"] == pytest.approx(torch.tensor(row["loss"]).exp().item())
        assert len(row["per_position_loss"]) == row["length"]
        bins = row["per_position_bins"]
        assert sum(b["tokens"] for b in bins) == row["tokens"]
        assert sum(b["loss"] * b["tokens"] for b in bins) / row["tokens"] == pytest.approx(row["loss"])
    with open(tmp_path / EVAL_DIR / "extrapolation.csv") as f:
        lines = list(csv.DictReader(f))
    assert list(lines[0]) == CSV_COLUMNS and len(lines) == len(rows)
    assert {line["multiple"] for line in lines} == {"1.0", "2.0", "4.0"}
    for name in ("ppl_vs_length.png", "per_position.png"):
        assert_png(tmp_path / EVAL_DIR / name)


def test_repeated_evaluations_accumulate_and_replace_matching_rows(val_tokens, tmp_path):
    evaluate(config(), val_tokens, tmp_path)
    evaluate(config(variations=["yarn:4", "ntk:4"], protocols=["nonoverlapping"]), val_tokens, tmp_path)
    rows = read_document(tmp_path)["results"]
    assert len(rows) == 6 + 3 + 3
    assert {
        (r["variation_settings"]["scaling"]["type"], r["variation_settings"]["scaling"]["factor"]) for r in rows
    } == {("none", 1), ("yarn", 4), ("ntk", 4)}
    assert {r["variation"] for r in rows} == {"", "yarn:4", "ntk:4"}  # labels; the run as trained has none

    # a later evaluation replaces only the rows it measures again (here: yarn:4, nonoverlapping), also rows
    # written before a setting existed (here: pe.scaling.attention_factor, null by default)
    document = read_document(tmp_path)
    for row in document["results"]:
        row["ppl"] = -1.0
        del row["variation_settings"]["scaling"]["attention_factor"]
    (tmp_path / EVAL_DIR / "extrapolation.json").write_text(json.dumps(document))
    evaluate(config(variations=["yarn:4"], protocols=["nonoverlapping"]), val_tokens, tmp_path)
    rows = read_document(tmp_path)["results"]
    assert len(rows) == 12
    assert all((r["ppl"] > 0) == (r["variation_settings"]["scaling"]["type"] == "yarn") for r in rows)

    # another checkpoint (training step): the old rows describe another model and go
    evaluate(config(protocols=["sliding"]), val_tokens, tmp_path, step=10)
    document = read_document(tmp_path)
    assert document["step"] == 10 and len(document["results"]) == 3


def test_learned_beyond_its_table_stays_in_the_results_with_null_ppl(val_tokens, tmp_path):
    document = evaluate(config(LearnedConfig()), val_tokens, tmp_path)
    beyond = [row for row in document["results"] if row["length"] > 8]
    assert len(beyond) == 4
    for row in beyond:
        assert row["ppl"] is None and row["loss"] is None and "at most 8 positions" in row["reason"]
        assert row["variation"] == "" and row["variation_settings"] == {}
    with open(tmp_path / EVAL_DIR / "extrapolation.csv") as f:
        assert {line["ppl"] for line in csv.DictReader(f) if line["length"] == "16"} == {""}
    assert_png(tmp_path / EVAL_DIR / "ppl_vs_length.png")


def test_per_position_plot_draws_the_longest_length_unless_told(val_tokens, tmp_path):
    document = evaluate(config(), val_tokens, tmp_path)
    assert [(r["length"], r["protocol"]) for r in per_position_rows(document)] == [(32, "nonoverlapping")]
    assert [r["length"] for r in per_position_rows(document, [8, 16])] == [8, 16]


class FakeRun:
    def __init__(self):
        self.logged, self.summary = {}, {}

    def log(self, data):
        self.logged.update(data)


def test_the_table_and_plots_go_to_wandb(val_tokens, tmp_path):
    import wandb

    run = FakeRun()
    document = evaluate(config(variations=["none", "yarn:4"]), val_tokens, tmp_path, wandb_run=run)
    table = run.logged["extrapolation/table"]
    assert isinstance(table, wandb.Table) and table.columns == CSV_COLUMNS
    assert len(table.data) == len(document["results"]) == 12
    assert isinstance(run.logged["extrapolation/ppl_vs_length"], wandb.Image)
    assert isinstance(run.logged["extrapolation/per_position"], wandb.Image)
    assert run.summary["extrapolation/sliding yarn:4/ppl@32"] == next(
        r["ppl"]
        for r in document["results"]
        if r["length"] == 32 and r["protocol"] == "sliding" and r["variation_settings"]["scaling"]["type"] == "yarn"
    )


def test_the_printed_table_has_a_row_per_setting_and_a_column_per_length(val_tokens, tmp_path):
    document = evaluate(config(variations=["none", "yarn:4"], protocols=["nonoverlapping"]), val_tokens, tmp_path)
    lines = format_table(document, PERPLEXITY_ROWS).splitlines()
    assert lines[0].split() == ["pe=rope", "ppl", "8", "(1×)", "16", "(2×)", "32", "(4×)"]
    ppl = {(r["variation_settings"]["scaling"]["type"], r["length"]): r["ppl"] for r in document["results"]}
    assert lines[1].split() == ["nonoverlapping"] + [format_ppl(ppl["none", L]) for L in (8, 16, 32)]
    assert lines[2].split() == ["nonoverlapping", "yarn:4"] + [format_ppl(ppl["yarn", L]) for L in (8, 16, 32)]
    assert len({len(line) for line in lines[:3]}) == 1  # aligned columns
    assert lines[3] == "(each cell scores the same targets: [32, 96))"


@pytest.mark.slow  # a second interpreter
def test_each_scheme_has_one_colour_in_every_plot(tmp_path, monkeypatch):
    shipped = sorted(path.stem for path in (REPO / "configs" / "pe").glob("*.yaml"))
    declared = {name: COLOURS[name] for name in shipped if name in COLOURS}  # the others: a colour from their name
    assert all(declared.values()) and len({scheme_colour(name) for name in shipped}) == len(shipped)
    assert scheme_colour("rope") == declared["rope"]
    new = scheme_colour("myscheme")  # a scheme added later: a colour from its name alone, the same in any process
    assert re.fullmatch("#[0-9a-f]{6}", new) and new not in declared.values() and new != scheme_colour("other")
    other_process = subprocess.run(
        [sys.executable, "-c", "from evaluation.plots import scheme_colour; print(scheme_colour('myscheme'))"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        check=True,
    )
    assert other_process.stdout.strip() == new

    drawn = {}
    monkeypatch.setattr(plots, "_label_and_save", lambda fig, ax, *args: drawn.setdefault(args[-1], ax))
    series = [
        Series("rope", "rope", [8, 16], [20.0, 25.0], [1.0, 2.0]),
        Series("mine", "myscheme", [8, 16], [21.0, 22.0]),
        Series("rope yarn:4", "rope", [8, 16], [22.0, 23.0], [0.5, 0.5]),
    ]
    plots.plot_ppl_vs_length(series, {8}, tmp_path / "a.png", "by length")
    plots.plot_per_position(series, {8}, tmp_path / "b.png", "by position")
    for ax in drawn.values():
        lines = [line for line in ax.get_lines() if line.get_label() != "training length"]
        assert [line.get_color() for line in lines] == [scheme_colour("rope"), new, scheme_colour("rope")]
        assert lines[0].get_linestyle() != lines[2].get_linestyle()  # one scheme's settings: other line styles
        assert len(ax.collections) == 2  # a CI band for each series with half-widths


def test_a_crowded_legend_goes_beside_the_panel_where_it_hides_no_line(tmp_path, monkeypatch):
    drawn = []

    def label_only(fig, ax, xlabel, ylabel, path):
        plots._label(ax, xlabel, ylabel)
        drawn.append(ax)

    monkeypatch.setattr(plots, "_label_and_save", label_only)
    for count in (plots.CROWDED_LEGEND - 1, plots.CROWDED_LEGEND + 1):  # with the training length's line: <=, >
        series = [Series(f"s{i}", "rope", [8, 16], [0.5, 0.4]) for i in range(count)]
        plots.plot_accuracy_vs_length(series, {8}, tmp_path / f"{count}.png", "accuracy")
    few, many = (ax.get_legend() for ax in drawn)
    assert len(few.get_texts()) == plots.CROWDED_LEGEND and len(many.get_texts()) == plots.CROWDED_LEGEND + 2
    beside = many.get_bbox_to_anchor().transformed(drawn[1].transAxes.inverted())
    assert beside.x0 > 1  # right of the axes
    assert few.get_bbox_to_anchor().transformed(drawn[0].transAxes.inverted()).x0 == 0  # inside, matplotlib's best


def test_a_malformed_previous_results_file_is_refused_before_scoring_and_kept(val_tokens, tmp_path):
    """Rows it holds may be what a study reports: the evaluation refuses it, naming it, before scoring anything
    (rewriting it would lose them)."""
    (tmp_path / EVAL_DIR).mkdir()
    damaged = '{"pe": "rope", "results": [{"length": 8}]}'
    (tmp_path / EVAL_DIR / "extrapolation.json").write_text(damaged)
    cfg = config(protocols=["sliding"])
    context = evaluation_plan(cfg).context(build_model(cfg).eval(), tmp_path, CPU, torch.float32, {})
    with pytest.raises(PosGPTError, match="extrapolation.json is malformed: no 'pe' name"):
        check_evaluators(context, plan_evaluators(cfg))
    assert sorted(path.name for path in (tmp_path / EVAL_DIR).iterdir()) == ["extrapolation.json"]
    assert (tmp_path / EVAL_DIR / "extrapolation.json").read_text() == damaged


def test_wandb_online_without_a_login_is_one_line(tmp_path, monkeypatch):
    """W&B's UsageError traceback, exit 1 (and with a key but no network, its CommError after its own timeout)."""

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc holding a key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    cfg = compose_config(["logging.wandb.mode=online"])
    with pytest.raises(PosGPTError, match=r"^logging.wandb.mode=online: W&B could not start \(UsageError: "):
        init_wandb(tracker_settings(cfg), tmp_path, None)
