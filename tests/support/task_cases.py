"""What the tests of the tasks and their evaluation share (tests/data/tasks/, tests/evaluation/): a seeded
generator on the CPU."""

from __future__ import annotations

import torch


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _starts(row: list[int], marker: int) -> list[int]:
    return [i for i, token in enumerate(row) if token == marker]
