"""MQAR (data/tasks/mqar.py): every query answers its value, distinct values and query gaps as Zoology draws them,
answers as targets only, and a mixture of pair counts in training."""

from __future__ import annotations

import pytest
import torch
from task_cases import gen

from core.errors import PosGPTError
from data import draw_batch
from data.tasks import build_task
from data.tasks.mqar import MQARConfig


def test_mqar_every_query_answers_its_value():
    task = build_task(MQARConfig(n_pairs=4, n_keys=8, n_values=8))
    tokens, answer = task.generate(16, 64, gen())
    for row, mask in zip(tokens, answer):
        pairs = dict(zip(row[0:8:2].tolist(), row[1:8:2].tolist()))
        assert len(pairs) == 4 and all(1 <= k <= 8 for k in pairs) and all(9 <= v <= 16 for v in pairs.values())
        answers = mask.nonzero().flatten().tolist()
        assert len(answers) == 4 and min(answers) > 8
        assert sorted(row[a - 1].item() for a in answers) == sorted(pairs)  # each key queried once
        assert all(pairs[row[a - 1].item()] == row[a].item() for a in answers)
        assert int((row[8:] != 0).sum()) == 8  # the rest is blank besides the queries


def test_mqar_draws_distinct_values_as_zoology_does():
    task = build_task(MQARConfig(n_pairs=8, n_keys=8, n_values=8))  # as many values as pairs: a permutation
    tokens, _ = task.generate(64, 64, gen())
    assert all(sorted(row[1:16:2].tolist()) == list(range(9, 17)) for row in tokens)
    with pytest.raises(PosGPTError, match="distinct values"):
        build_task(MQARConfig(n_pairs=8, n_keys=8, n_values=7))


def test_mqar_query_gaps_follow_zoologys_power_law():
    """Slot s (1 = just after the pairs) is drawn with probability proportional to a * s^(a - 1): with one pair,
    the first draw is exactly that distribution; power_a=1 is uniform."""
    n_slots, n = 30, 40_000
    for power_a in (0.01, 0.5, 1.0):
        task = build_task(MQARConfig(n_pairs=1, n_keys=2, n_values=2, power_a=power_a))
        _, answer = task.generate(n, 2 + 2 * n_slots, gen())
        slot = (answer.float().argmax(dim=1) - 3) // 2  # the answer sits at 2 + 2 * slot + 1
        observed = torch.bincount(slot, minlength=n_slots).double() / n
        s = torch.arange(1, n_slots + 1, dtype=torch.float64)
        expected = s ** (power_a - 1) / (s ** (power_a - 1)).sum()
        assert (observed - expected).abs().max() < 0.01, power_a


def test_mqar_answers_are_targets_only():
    """An answer's input position holds the blank (Zoology's inputs have filler there): the values answered so
    far must not tell later queries which values remain."""
    task = build_task(MQARConfig(n_pairs=4, n_keys=8, n_values=8))
    x, y = task.sample(16, 63, gen())
    tokens, answer = task.generate(16, 64, gen())  # the same stream: the same examples
    torch.testing.assert_close(y, tokens[:, 1:].masked_fill(~answer[:, 1:], -100))
    assert (x[answer[:, :-1]] == 0).all() and (x[~answer[:, :-1]] == tokens[:, :-1][~answer[:, :-1]]).all()
    assert (y[:, :8] == -100).all()  # nothing in the context pairs is scored


def test_mqar_trains_on_a_mixture_of_pair_counts_and_evaluates_at_n_pairs():
    task = build_task(MQARConfig(n_pairs=8, n_keys=16, n_values=16, min_pairs=2))
    generator = gen()
    drawn = [task.training_cell(generator)["n_pairs"] for _ in range(400)]
    assert set(drawn) == set(range(2, 9))
    tokens, answer = task.generate(4, 64, gen(), n_pairs=3)
    assert (answer.sum(dim=1) == 3).all() and (tokens[:, 6:] != 0).sum() == 4 * 6
    assert (task.sample(4, 63, gen())[1] != -100).sum() == 4 * 8  # evaluation: no cell, n_pairs
    generator = gen()  # training batches (train.py's stream) mix; validation batches are at n_pairs
    answered = {int((draw_batch(task, 4, 63, generator, training=True)[1] != -100).sum()) // 4 for _ in range(50)}
    assert answered == set(range(2, 9))
    assert {int((draw_batch(task, 4, 63, generator)[1] != -100).sum()) for _ in range(5)} == {4 * 8}
    still = gen()
    assert build_task(MQARConfig()).training_cell(still) == {}  # no mixture: nothing drawn
    assert torch.equal(still.get_state(), gen().get_state())
    with pytest.raises(PosGPTError, match="min_pairs"):
        build_task(MQARConfig(n_pairs=4, min_pairs=5))
