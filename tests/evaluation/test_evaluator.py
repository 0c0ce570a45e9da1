"""An evaluator is a plug-in (evaluation/evaluator.py): one defined in this test module alone, with no other file
touched, is selected by eval.evaluators, runs through eval.py beside the built-in ones, writes its rows to a results
file of its own (stamped with what scored them), and shows up in compare.py's report over seeds. Its refusals come
before anything is written. The built-in evaluators are found by their modules alone, and each records the settings
it reads."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import assert_one_line_error
from repo_root import REPO
from tiny_checkpoint import make_run

from core.errors import PosGPTError
from evaluation.evaluator import EVALUATORS, Evaluator, registered, select_evaluators
from evaluation.value_format import value_rows
from experiment.compose import compose_config


@dataclass(frozen=True)
class ConfidenceSettings:
    batch_tokens: int
    max_tokens: int


class NextTokenConfidence(Evaluator):
    """The mean probability the model gives its own most likely next token, over the first window of each length;
    refused where a length exceeds eval.max_tokens."""

    name = "toy_confidence"
    runs = "text"
    Settings = ConfidenceSettings
    recorded = ("batch_tokens",)
    rows = value_rows("toy_confidence", "confidence", higher_is_better=True)

    def check(self, ctx) -> None:
        if max(ctx.lengths) > self.settings.max_tokens:
            raise PosGPTError(f"toy_confidence: length {max(ctx.lengths)} exceeds eval.max_tokens")

    def run(self, ctx, tokens) -> list[dict]:
        rows = []
        for _, fields in ctx.variations():
            for length in ctx.lengths:
                window = torch.from_numpy(tokens.read(0, length).astype(np.int64))[None].to(ctx.device)
                with torch.no_grad():
                    confidence = ctx.model(window).softmax(-1).max(-1).values.mean().item()
                rows.append({"length": length, **fields, "confidence": confidence, "tokens": length})
        return rows


def tree(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()
    }


def test_a_plugin_defined_in_a_test_module_runs_through_eval_and_compare(cli, tmp_path):
    runs = [make_run(tmp_path / f"rope-s{seed}", cli.corpus, "pe=rope", f"train.seed={seed}") for seed in (1, 2)]
    keys = ["eval.lengths=[16,32]", "eval.protocols=[nonoverlapping]", "eval.evaluators=[toy_confidence]"]
    for run_dir in runs:
        done = cli.eval_here(run_dir, *keys, "eval.variations=[none,yarn:2]")
        assert done.returncode == 0, done.stderr
        assert "pe=rope confidence" in done.stdout and "yarn:2" in done.stdout  # its table, by the one renderer
    document = json.loads((runs[0] / "eval" / "toy_confidence.json").read_text())
    rows = document["results"]
    assert sorted((row["variation"], row["length"]) for row in rows) == [
        ("", 16),
        ("", 32),
        ("yarn:2", 16),
        ("yarn:2", 32),
    ]
    for row in rows:
        assert 0 < row["confidence"] <= 1 and row["evaluator"] == "toy_confidence"
        assert row["evaluator_settings"] == {"batch_tokens": 16384} and row["train_seed"] == 1
        assert row["scored"] == row["length"] and row["scored_unit"] == "tokens" and len(row["weights"]) == 16
    assert {path.name for path in (runs[0] / "eval").iterdir()} >= {
        "toy_confidence.json", "toy_confidence.csv", "confidence_vs_length.png", "extrapolation.json"
    }  # fmt: skip
    done = cli.here("scripts/compare.py", *map(str, runs), "--markdown", str(tmp_path / "c.md"))
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "c.md").read_text()
    section = report.split("## confidence (eval/toy_confidence.json)")[1]
    assert "| rope | 2 |" in section and "| rope yarn:2 | 2 |" in section and " ± " in section


def test_a_plugins_refusal_comes_before_anything_is_written(cli, tmp_path):
    run_dir = make_run(tmp_path / "run", cli.corpus, "pe=rope")
    before = tree(run_dir)
    done = cli.eval_here(run_dir, "eval.lengths=[16,64]", "eval.max_tokens=32", "eval.evaluators=[toy_confidence]")
    assert_one_line_error(done)  # eval.max_tokens is refused for perplexity first, or the toy's own line
    assert tree(run_dir) == before


def test_eval_evaluators_names_a_known_evaluator_of_the_runs_kind():
    registered()
    text = compose_config([]).eval
    with pytest.raises(PosGPTError, match=r"eval.evaluators names \['nonesuch'\], which no evaluator is"):
        select_evaluators({**text, "evaluators": ["nonesuch"]}, "text")
    with pytest.raises(PosGPTError, match=r"\['task_accuracy'\], which score another kind of run"):
        select_evaluators({**text, "evaluators": ["task_accuracy"]}, "text")
    chosen = [evaluator.name for evaluator in select_evaluators({**text, "evaluators": ["toy_confidence"]}, "text")]
    assert chosen == ["perplexity", "toy_confidence"]  # added to what the settings ask for


def test_the_built_in_evaluators_are_found_by_their_modules_and_record_what_they_read():
    """Each module of evaluation/evaluators/ registers its evaluator; every recorded setting is one it reads."""
    modules = {path.stem for path in (REPO / "evaluation" / "evaluators").glob("[!_]*.py")}
    built_in = {name: cls for name, cls in registered().items() if cls.__module__.startswith("evaluation.evaluators.")}
    assert {cls.__module__.rsplit(".", 1)[1] for cls in built_in.values()} == modules
    for cls in built_in.values():
        read = {field for field in cls.Settings.__dataclass_fields__}
        assert set(cls.recorded) <= read, cls.name
        assert set(read) <= set(compose_config([]).eval), cls.name  # typed settings are eval.* keys
    assert EVALUATORS["toy_confidence"] is NextTokenConfidence


def test_first_token_mass_of_uniform_attention_is_the_harmonic_mean():
    """Zero query and key weights make every softmax row uniform: query i gives its first token 1/(i+1), so the
    mean over queries 1 .. L-1 is (H_L - 1)/(L - 1), in every layer."""
    from evaluation.evaluators.first_token import first_token_mass
    from model import GPT, ModelConfig
    from model.pe import SCHEMES

    torch.manual_seed(0)
    model = GPT(
        ModelConfig(n_embd=16, n_layer=2, n_head=2, vocab_size=100), SCHEMES["none"].config_class(), train_seq_len=16
    ).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:32] = 0  # queries and keys; the values stay
            block.attn.qkv.bias[:32] = 0
    length = 12
    windows = torch.randint(0, 100, (3, length), generator=torch.Generator().manual_seed(1))
    expected = (sum(1 / k for k in range(1, length + 1)) - 1) / (length - 1)
    assert first_token_mass(model, windows, torch.device("cpu"), torch.float32) == pytest.approx([expected] * 2)


def test_first_token_rows_through_eval(cli, tmp_path):
    run_dir = make_run(tmp_path / "run", cli.corpus, "pe=rope", "model.attn_gate=true")
    keys = ["eval.lengths=[16,32]", "eval.protocols=[nonoverlapping]", "eval.evaluators=[first_token]"]
    done = cli.eval_here(run_dir, *keys, "eval.max_tokens=64")
    assert done.returncode == 0, done.stderr
    rows = json.loads((run_dir / "eval" / "first_token.json").read_text())["results"]
    assert [(row["length"], row["windows"]) for row in rows] == [(16, 4), (32, 2)]
    for row in rows:
        assert 0 < row["first_token_mass"] < 1 and len(row["first_token_mass_by_layer"]) == 1
        assert row["first_token_mass"] == pytest.approx(np.mean(row["first_token_mass_by_layer"]))


def test_a_plugins_rows_of_settings_trained_at_other_lengths_say_their_lengths(monkeypatch):
    """compare.py's section of a plug-in's rows labels each setting by its training length where they differ, as
    the perplexity and task tables do (reports/tables.py's told_apart_by_training_length)."""
    from reports import metrics
    from reports.runs import Entry

    rows = value_rows("toy_confidence", "confidence", higher_is_better=True)
    entries = [Entry("rope", "rope", 16), Entry("alibi", "alibi", 32)]
    for entry, value in zip(entries, (0.5, 0.7)):
        entry.per_seed.append({16: {"confidence": value}})
        entry.seeds.append(1)
    monkeypatch.setattr(metrics, "plugin_formats", lambda: {rows.file: rows})
    monkeypatch.setattr(metrics, "metric_entries", lambda runs, formats: entries)
    report = metrics.metric_report([])
    assert "| rope (trained at 16) | 1 | 0.5000 |" in report and "| alibi (trained at 32) | 1 | **0.7000** |" in report
