"""Aggregation (data/tasks/aggregation.py): the symbols twice as frequent, in ascending order."""

from __future__ import annotations

from collections import Counter

import pytest
from task_cases import gen

from core.errors import PosGPTError
from data.tasks import build_task
from data.tasks.aggregation import AggregationConfig


def test_aggregation_answers_the_symbols_twice_as_frequent_in_ascending_order():
    task = build_task(AggregationConfig(n_symbols=6, n_frequent=2))
    for length in (task.min_length(), 100):
        tokens, answer = task.generate(16, length, gen(2))
        a = (length - 3) // (2 * 2 + 4)
        for row, mask in zip(tokens.tolist(), answer.tolist()):
            counts = Counter(row[:-3])
            frequent = sorted(symbol for symbol in range(6) if counts[symbol] == 2 * a)
            assert len(frequent) == 2 and all(counts[s] == a for s in range(6) if s not in frequent)
            assert row[-3] == 7 and row[-2:] == frequent and mask == [False] * (length - 2) + [True, True]
    with pytest.raises(PosGPTError, match="n_frequent"):
        build_task(AggregationConfig(n_symbols=3, n_frequent=3))
