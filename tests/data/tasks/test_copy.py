"""The copy task (data/tasks/copy.py): the scattered tokens repeated in order."""

from __future__ import annotations

import torch
from task_cases import gen

from data.tasks import build_task
from data.tasks.copy import CopyConfig


def test_copy_repeats_the_scattered_tokens_in_order():
    task = build_task(CopyConfig(n_tokens=5, n_symbols=6))
    tokens, answer = task.generate(16, 50, gen())
    for row, mask in zip(tokens, answer):
        spread = 50 - 5 - 1
        assert row[spread] == 7 and mask[spread + 1 :].all() and not mask[: spread + 1].any()
        data = row[:spread][row[:spread] != 0]
        assert torch.equal(data, row[spread + 1 :])
