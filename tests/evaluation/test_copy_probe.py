"""The copy probe (evaluation/copy_probe.py): the span written twice into held-out text, the candidates and their
count, a copier helped by the first copy and a model blind to context not, the scores against the full logits,
shared windows and control, language-model runs only, and two settings shown apart."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from task_cases import gen

from core.errors import PosGPTError
from data import EOT_TOKEN, TokenArray
from data.config import DataConfig
from evaluation import copy_probe
from evaluation.context import EvalContext
from evaluation.copy_probe import ProbeSettings, probe_windows, score_copies, span_candidates, with_first_copy
from evaluation.render import format_table, write_plots
from evaluation.task_accuracy import (
    TASK_ROWS,
)
from experiment.compose import compose_config
from experiment.config import validate
from model import GPT
from model.gpt import ModelConfig
from model.pe.rope import RoPEConfig

CPU = torch.device("cpu")


def shard(tmp_path, n: int) -> TokenArray:
    path = tmp_path / "tokens.bin"
    np.arange(n, dtype=np.uint16).tofile(path)
    return TokenArray([path], name="val")


def test_copy_probe_writes_the_span_twice_into_held_out_text(tmp_path):
    tokens = shard(tmp_path, 1000)
    control = probe_windows(tokens, 6, 64, 8, span_candidates(50257), gen())
    windows = with_first_copy(control, 40, 8)
    assert windows.shape == control.shape == (6, 64)
    assert torch.equal(windows[:, 56:], windows[:, 16:24])  # first copy at 64 - 8 - 40
    text = torch.cat((windows[:, :16], windows[:, 24:56]), dim=1)
    assert ((text[:, 1:] - text[:, :-1]) == 1).sum() >= 6 * 30  # the rest is the (consecutive) text
    assert not (windows[:, 56:] == EOT_TOKEN).any()
    # the control: the same windows and span, the text left where the first copy was
    assert torch.equal(control[:, 56:], windows[:, 56:]) and torch.equal(control[:, :16], windows[:, :16])
    assert torch.equal(control[:, 16:24], control[:, 15:23] + 1)  # consecutive text, no copy
    # another distance writes into the same windows, and leaves the control as drawn
    farther = with_first_copy(control, 48, 8)
    assert torch.equal(farther[:, 8:16], control[:, 56:]) and torch.equal(farther[:, 16:], control[:, 16:])
    assert torch.equal(control[:, 16:24], control[:, 15:23] + 1)


def test_the_whole_vocabulary_draw_is_the_one_results_were_made_with(tmp_path):
    """eval.copy_min_count=0 draws the span as the probe did before candidates existed (uniform over 0..50255,
    shifted past <|endoftext|>)."""
    tokens = shard(tmp_path, 1000)
    windows = probe_windows(tokens, 50, 64, 8, span_candidates(50257), gen(3))
    generator = gen(3)
    torch.randint(0, 1000 - 64 + 1, (50,), generator=generator)  # the window starts
    draws = torch.randint(0, 50257 - 1, (50, 8), generator=generator)
    assert torch.equal(windows[:, 56:], draws + (draws >= EOT_TOKEN).long())


def test_span_candidates_are_the_tokens_seen_often_enough(tmp_path):
    path = tmp_path / "train.bin"
    np.array([5, 5, 5, 7, 7, 9, EOT_TOKEN, EOT_TOKEN, EOT_TOKEN, 299], dtype=np.uint16).tofile(path)
    train = TokenArray([path], name="train")
    assert span_candidates(300, 1, train).tolist() == [5, 7, 9, 299]  # never <|endoftext|> (out of range here)
    assert span_candidates(50257, 2, train).tolist() == [5, 7]  # <|endoftext|> is never a candidate
    assert span_candidates(300, 4, train).tolist() == []
    assert len(span_candidates(300)) == 300 and len(span_candidates(50257)) == 50256
    windows = probe_windows(shard(tmp_path, 100), 40, 32, 6, span_candidates(300, 2, train), gen())
    assert set(windows[:, 26:].unique().tolist()) == {5, 7}


def test_probe_candidates_count_the_training_split_once_a_process(tmp_path, monkeypatch):
    """Training checks eval.copy_min_count before its first step and scores the probe after its last: one count."""
    path = tmp_path / "train.bin"
    np.array([5, 5, 7, 7, 9], dtype=np.uint16).tofile(path)
    loads = []
    monkeypatch.setattr(copy_probe, "_COUNTED_CANDIDATES", {})
    monkeypatch.setattr(
        copy_probe, "load_split", lambda data, split, progress: loads.append(data.name) or TokenArray([path])
    )

    def candidates(name: str, min_count: int) -> list[int]:
        return copy_probe.probe_candidates(DataConfig(name=name), min_count, 300).tolist()

    assert candidates("a", 2) == [5, 7]
    assert candidates("a", 2) == [5, 7] and loads == ["a"]
    assert candidates("b", 1) == [5, 7, 9] and loads == ["a", "b"]
    for _ in range(2):  # a refusal is as reliable the second time
        with pytest.raises(PosGPTError, match="eval.copy_min_count=3 leaves 0 token"):
            candidates("a", 3)


class ContextBlind(torch.nn.Module):
    """A bigram model: its prediction at a position depends on that position's token alone."""

    vocab_size = 300

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(300, 300)
        self.head_weight = torch.eye(300)

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embedding(idx)


class Copier(ContextBlind):
    """An induction head written out: at each position, the token that followed the latest earlier occurrence of
    this position's token (nothing where there is none)."""

    def hidden_states(self, idx: torch.Tensor) -> torch.Tensor:
        hidden = torch.zeros(*idx.shape, 300)
        for b, row in enumerate(idx.tolist()):
            for t, token in enumerate(row):
                earlier = [s for s in range(t) if row[s] == token]
                if earlier:
                    hidden[b, t, row[earlier[-1] + 1]] = 20.0
        return hidden


def probe_and_control(model, tokens: TokenArray) -> list[tuple[int, int, float]]:
    control = probe_windows(tokens, 7, 32, 6, span_candidates(300), gen())
    return [
        score_copies(model, windows, 6, 64, CPU, torch.float32)
        for windows in (with_first_copy(control, 10, 6), control)
    ]


def test_the_first_copy_helps_a_copier_and_not_a_model_blind_to_context(tmp_path):
    """copy_gain (the probe's log-probability minus its control's, the same span without the first copy) is
    exactly 0 for a model that cannot look back, and near ln 300 for one that copies."""
    torch.manual_seed(0)
    tokens = shard(tmp_path, 300)
    blind = probe_and_control(ContextBlind().eval(), tokens)
    assert blind[0] == blind[1]  # same span, same predictions: the first copy changes nothing
    (exact, right, logprob), (control_exact, _, control) = probe_and_control(Copier(), tokens)
    assert exact >= 6 and right >= 33 and control_exact == 0  # 7 examples x 5 targets; a span may repeat a token
    assert (logprob - control) / 35 > 0.8 * math.log(300)


def test_copy_probe_scores_match_the_full_logits(tmp_path):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=300), RoPEConfig(), train_seq_len=32).eval()
    windows = with_first_copy(probe_windows(shard(tmp_path, 300), 5, 32, 6, span_candidates(300), gen()), 10, 6)
    exact, right, logprob = score_copies(model, windows, 6, 64, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        logits = model(windows)[:, 26:31]
    targets = windows[:, 27:32]
    hits = logits.argmax(-1) == targets
    assert (exact, right) == (int(hits.all(1).sum()), int(hits.sum()))
    expected = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).sum()
    assert logprob == pytest.approx(float(expected), rel=1e-5)


def probe_context(model: torch.nn.Module, run_dir: Path) -> EvalContext:
    """The context the copy probe scores ``model`` in: lengths 16 and 32, training seed 1."""
    return EvalContext(model, run_dir, CPU, torch.float32, {}, 0, [16, 32], "rope", 32, 1, data=DataConfig())


def test_the_distances_of_a_length_share_their_windows_and_control(tmp_path):
    """probe_length draws one set of windows and spans a length: each distance's row scores its first copy
    written into them, against one control."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=300), RoPEConfig(), train_seq_len=32).eval()
    settings = ProbeSettings(copy_span=6, copy_min_count=0, task_half_width=0.3, task_threshold=0.9, batch_tokens=64)
    tokens, candidates = shard(tmp_path, 300), span_candidates(300)
    context = probe_context(model, tmp_path)
    rows = copy_probe.probe_length(context, settings, tokens, candidates, {"length": 32}, [10, 26])
    assert [row["distance"] for row in rows] == [10, 26] and len({row["seed"] for row in rows}) == 1
    control = probe_windows(tokens, 11, 32, 6, candidates, torch.Generator().manual_seed(rows[0]["seed"]))
    *_, control_logprob = score_copies(model, control, 6, 64, CPU, torch.float32)
    for row in rows:
        exact, _, logprob = score_copies(model, with_first_copy(control, row["distance"], 6), 6, 64, CPU, torch.float32)
        assert row["n"] == 11 and row["correct"] == exact
        assert row["mean_logprob"] == pytest.approx(logprob / 55) and row["control_logprob"] == control_logprob / 55
    assert rows[0]["mean_logprob"] != rows[1]["mean_logprob"]  # the first copies differ
    other = copy_probe.probe_length(context, settings, tokens, candidates, {"length": 16}, [10])
    assert other[0]["seed"] != rows[0]["seed"]  # another length, another draw


def test_probes_are_for_language_model_runs():
    with pytest.raises(PosGPTError, match=re.escape("eval.tasks[0]='passkey' is not one of its choices: copy_probe")):
        validate(compose_config(["eval.tasks=[passkey]"]))
    with pytest.raises(PosGPTError, match="is not one of its choices"):  # not "eval.copy_span is read only when ..."
        validate(compose_config(["eval.tasks=[copy]", "eval.copy_span=8"]))
    with pytest.raises(PosGPTError, match="language-model run"):
        validate(compose_config(["task=passkey", "eval.tasks=[copy_probe]"]))
    validate(compose_config(["eval.tasks=[copy_probe]"]))


def probe_row(length: int, distance: int, min_count: int, gain: float) -> dict:
    return dict(
        task="copy_probe",
        length=length,
        distance=distance,
        copy_span=16,
        copy_min_count=min_count,
        data="python_stdlib",
        corpus="c",
        split="val",
        accuracy=0.0,
        ci_low=0.0,
        ci_high=0.1,
        n=97,
        copy_gain=gain,
    )


def test_probes_of_two_settings_are_shown_apart(tmp_path):
    """Rows of eval.copy_min_count 0 and 1000 in one tasks.json: a table row each, a heatmap each, none pooled."""
    rows = [probe_row(64, 48, 0, 0.161), probe_row(64, 48, 1000, 0.034), probe_row(128, 48, 1000, -0.011)]
    document = {"task": "copy_probe", "pe": "rope", "train_seq_len": 64, "step": 500, "results": rows}
    document.update(threshold=0.9, effective_length={})
    text = format_table(document, TASK_ROWS)
    assert "distance 48 copy_min_count=0 " in text and "distance 48 copy_min_count=1000 " in text
    accuracy, gain = text.split("copy_gain (nats the first copy adds)")
    assert gain.count("+0.161") == 1 and "+0.034" in gain and "-0.011" in gain
    (tmp_path / "distance_length.png").write_bytes(b"stale")  # drawn when the run had one probe setting
    plots = write_plots(document, tmp_path, TASK_ROWS, {})
    names = sorted(path.name for path in tmp_path.glob("distance_length*.png"))
    assert names == ["distance_length_copy_min_count=0.png", "distance_length_copy_min_count=1000.png"]
    assert sorted(plots) == ["distance_length_copy_min_count=0", "distance_length_copy_min_count=1000"]
    # probes of other text: the file name holds no path separator
    other = {**document, "results": [rows[0], {**rows[1], "copy_min_count": 0, "corpus": "files /data/book one.txt"}]}
    assert "distance_length_corpus=files_data_book_one.txt" in write_plots(other, tmp_path, TASK_ROWS, {})
    # one setting alone: no suffix, as before
    assert "copy_min_count" not in format_table({**document, "results": rows[:1]}, TASK_ROWS)
