"""Task accuracy (evaluation/task_accuracy.py) on hand-made cases: Wilson intervals, exact match over every answer
token, each answer token counted in its place, the effective length, and an untrained model at chance."""

from __future__ import annotations

import pytest
import torch
from task_cases import gen

from data.tasks import build_task
from data.tasks.mqar import MQARConfig
from data.tasks.passkey import PasskeyConfig
from evaluation.task_accuracy import (
    count_exact_matches,
    effective_lengths,
    evaluate_cell,
    examples_for,
    wilson_interval,
)
from model import GPT
from model.gpt import ModelConfig
from model.pe.rope import RoPEConfig


def test_wilson_interval_and_examples():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 385)[0] == 0.0 and wilson_interval(385, 385)[1] == 1.0
    assert examples_for(0.05) == 385 and examples_for(0.1) == 97
    for h in (0.05, 0.02):  # n is enough for a half-width of at most h at any accuracy
        n = examples_for(h)
        assert max((wilson_interval(k, n)[1] - wilson_interval(k, n)[0]) / 2 for k in range(n + 1)) <= h


class Oracle(torch.nn.Module):
    """Logits that put the true next token first, except on the rows in ``wrong`` (one answer missed)."""

    def __init__(self, y: torch.Tensor, wrong: set[int], vocab: int) -> None:
        super().__init__()
        self.y, self.wrong, self.vocab, self.row = y, wrong, vocab, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.y[self.row : self.row + len(x)].clamp(min=0)
        logits = torch.nn.functional.one_hot(y, self.vocab).float()
        for i in range(len(x)):
            if self.row + i in self.wrong:  # the last answer token wrong
                logits[i, -1] = torch.nn.functional.one_hot((y[i, -1] + 1) % self.vocab, self.vocab).float()
        self.row += len(x)
        return logits


def test_exact_match_needs_every_answer_token():
    task = build_task(PasskeyConfig())
    x, y = task.sample(10, 40, gen())
    model = Oracle(y, wrong={2, 5, 9}, vocab=task.vocab_size)
    # batch_tokens=120: three rows per forward pass, four passes
    matches = count_exact_matches(model, x, y, 120, torch.device("cpu"), torch.float32)
    assert matches.correct == 7
    key_len = PasskeyConfig().key_len  # every example has key_len answer tokens; three had their last one wrong
    assert matches.answer_n == [10] * key_len and matches.answer_correct == [10] * (key_len - 1) + [7]


def test_each_answer_token_is_counted_in_its_place_among_its_examples_answers():
    """Answers of different counts per example (flip-flop's reads): the k-th answer token of every example that
    has k, whichever position it is at, in any batching."""
    y = torch.full((3, 8), -100)
    y[0, [1, 5]] = 1  # two answers
    y[1, [2, 3, 7]] = 1  # three
    y[2, [6]] = 1  # one
    model = Oracle(y, wrong={1}, vocab=4)  # example 1's last answer wrong
    for batch_tokens in (8, 24):
        model.row = 0
        matches = count_exact_matches(model, torch.zeros_like(y), y, batch_tokens, torch.device("cpu"), torch.float32)
        assert (matches.correct, matches.answer_correct, matches.answer_n) == (2, [3, 2, 0], [3, 2, 1])


def test_effective_length_is_where_accuracy_first_falls_below_the_threshold():
    def row(length, accuracy, variation="", depth=None):
        return {"task": "passkey", "length": length, "depth": depth, "accuracy": accuracy, "variation": variation}

    rows = [row(64, 1.0), row(128, 0.95), row(256, 0.5), row(512, 0.95), row(64, 0.2, depth=0.5)]
    rows += [row(64, 0.8, "yarn:8"), row(128, 1.0, "yarn:8")]
    rows += [row(64, 0.99, "ntk:8"), row(128, None, "ntk:8")]
    found = effective_lengths(rows, 0.9)
    assert found == {"": 128, "yarn:8": None, "ntk:8": 64}


def test_an_untrained_model_scores_at_chance():
    torch.manual_seed(0)
    for cfg in (PasskeyConfig(), MQARConfig()):
        task = build_task(cfg)
        model = GPT(ModelConfig(n_embd=32, vocab_size=task.vocab_size), RoPEConfig(), train_seq_len=64).eval()
        row = evaluate_cell(model, task, 64, {}, 200, 0, 4096, torch.device("cpu"), torch.float32)
        assert row["n"] == 200 and row["accuracy"] <= 0.02, (cfg.name, row)  # chance: 1e-4, 32^-8
        assert row["ci_low"] == 0.0 or row["ci_low"] < row["accuracy"] < row["ci_high"]
