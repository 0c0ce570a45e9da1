"""Needles (data/tasks/needles.py): the queried keys' values among distractors, a mixture of needle counts in
training, several distinct needles queried in turn, answers hidden from the inputs, and the draws pinned."""

from __future__ import annotations

import pytest
import torch
from task_cases import _starts, gen

from core.errors import PosGPTError
from data.tasks import build_task
from data.tasks.needles import NeedlesConfig


def test_needles_answer_the_queried_keys_values_among_distractors():
    cfg = NeedlesConfig(n_keys=3, n_values=2, n_symbols=6, n_key_symbols=5, filler_len=3)
    task = build_task(cfg)
    key_marker, query_marker = 6 + 5 + 3, 6 + 5 + 3 + 1
    for length in (cfg.n_keys * 4 + 4, 47):
        tokens, answer = task.generate(32, length, gen())
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            assert row[-4] == query_marker and mask == [False] * (length - 2) + [True, True]
            needles = {row[i + 1]: row[i + 2 : i + 4] for i in range(length - 4) if row[i] == key_marker}
            assert len(needles) == 3 and all(6 <= key < 11 for key in needles)  # distinct keys, all intact
            assert row[-2:] == needles[row[-3]]  # the queried key's values
            fill = [t for i, t in enumerate(row[:-4]) if not any(s <= i < s + 4 for s in _starts(row, key_marker))]
            assert set(fill) <= {11, 12, 13}


def test_needles_train_on_a_mixture_of_needle_counts_and_evaluate_at_n_keys():
    task = build_task(NeedlesConfig(n_keys=4, min_keys=1))
    key_marker = 10 + 16 + 5
    generator = gen()
    assert {task.training_cell(generator)["n_keys"] for _ in range(300)} == {1, 2, 3, 4}
    tokens, _ = task.generate(8, 40, gen(), n_keys=1)
    assert ((tokens == key_marker).sum(dim=1) == 1).all() and task.min_length(n_keys=1) == 8
    assert ((task.sample(8, 40, gen())[0] == key_marker).sum(dim=1) == 4).all()  # evaluation: n_keys
    counts = {
        frozenset((task.training_batch(16, 40, generator)[0] == key_marker).sum(dim=1).tolist()) for _ in range(40)
    }
    assert all(len(count) == 1 for count in counts) and len(counts) == 4  # one count a batch, every count drawn
    still = gen()
    assert build_task(NeedlesConfig()).training_cell(still) == {}  # no mixture: nothing drawn
    assert torch.equal(still.get_state(), gen().get_state())
    with pytest.raises(PosGPTError, match="min_keys=5 is more than task.n_keys=4"):
        build_task(NeedlesConfig(n_keys=4, min_keys=5))


def test_needles_query_several_distinct_needles_in_turn():
    """RULER's multi-query needle: n_queries distinct needles queried at the end, each followed by its values,
    every value an answer token; a batch with fewer needles than queries queries each once."""
    cfg = NeedlesConfig(n_keys=4, n_values=2, n_symbols=6, n_key_symbols=5, filler_len=3, n_queries=3, min_keys=1)
    task = build_task(cfg)
    key_marker, query_marker = 6 + 5 + 3, 6 + 5 + 3 + 1
    assert task.min_length() == (4 + 3) * 4 and task.min_length(n_keys=2) == (2 + 2) * 4
    for n_keys, length in ((4, 28), (4, 61), (2, 30)):
        n_queries = min(3, n_keys)
        tokens, answer = task.generate(32, length, gen(), n_keys=n_keys)
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            context = length - 4 * n_queries
            needles = {row[i + 1]: row[i + 2 : i + 4] for i in range(context) if row[i] == key_marker}
            assert len(needles) == n_keys
            tail = [row[i : i + 4] for i in range(context, length, 4)]
            assert [q[0] for q in tail] == [query_marker] * n_queries
            assert len({q[1] for q in tail}) == n_queries  # distinct needles
            assert all(q[2:] == needles[q[1]] for q in tail)  # each queried key's values
            assert mask == [False] * context + [False, False, True, True] * n_queries
    with pytest.raises(PosGPTError, match="n_queries=5 distinct needles to query need task.n_keys >= n_queries"):
        build_task(NeedlesConfig(n_keys=4, n_queries=5))


def test_needles_can_hide_answers_from_the_inputs():
    """task.hide_answers: the same instances, each answer's input position the blank (the new last token id), so
    that no query is answered from the values already given; the targets are the answers as before."""
    settings = {"n_keys": 4, "n_queries": 4, "min_keys": 1}
    shown, hidden = build_task(NeedlesConfig(**settings)), build_task(NeedlesConfig(**settings, hide_answers=True))
    assert hidden.vocab_size == shown.vocab_size + 1 and shown.answer_input is None
    (x, y), (hx, hy) = (task.training_batch(16, 63, gen()) for task in (shown, hidden))
    assert torch.equal(hy, y)
    answers = torch.zeros_like(y, dtype=torch.bool)
    answers[:, 1:] = y[:, :-1] != -100  # the input after an answer target is that answer
    assert answers.sum() > 0 and torch.equal(hx[answers], torch.full_like(hx[answers], hidden.vocab_size - 1))
    assert torch.equal(hx[~answers], x[~answers]) and not (x == hidden.vocab_size - 1).any()


PINNED_NEEDLES = [
    [31, 22, 1, 2, 31, 12, 1, 0, 29, 30, 26, 31, 13, 2, 9, 26, 31, 23, 7, 7, 32, 23, 7, 7],
    [26, 31, 21, 5, 2, 31, 12, 5, 0, 31, 22, 1, 2, 29, 30, 31, 13, 8, 7, 30, 32, 12, 5, 0],
]


def test_one_needle_query_draws_what_it_drew_before_n_queries():
    """Pinned instances of the default needles (one query): runs made before task.n_queries existed stay
    reproducible. The numbers are the default generator's draws at seed 0, recorded when n_queries was added."""
    tokens, answer = build_task(NeedlesConfig()).generate(2, 24, gen())
    assert tokens.tolist() == PINNED_NEEDLES and answer[:, -2:].all() and answer.sum() == 4
