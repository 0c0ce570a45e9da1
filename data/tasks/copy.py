"""Selective copying (Gu & Dao 2023, "Mamba", §3.1; after Arjovsky et al. 2016's copying task): data tokens
scattered among blanks must be repeated, in order, after a marker.

    0 d_1 0 0 d_2 0 .. d_n 0 0  COPY d_1 d_2 .. d_n
                                     ^^^^^^^^^^^^^ answer tokens (the last n)

- data: n = n_tokens symbols drawn uniformly from n_symbols, at random distinct positions of the first part
  (the rest blank), so the distance to copy over grows with the length;
Vocabulary: blank 0, symbols [1, 1 + n_symbols), COPY. Chance of an exact match: n_symbols^-n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from data.tasks.base import GeneratedTaskConfig, Task, random_ints


@dataclass
class CopyConfig(GeneratedTaskConfig):
    name: str = "copy"
    n_tokens: int = domain(8, ge=1)  # data tokens to copy
    n_symbols: int = domain(16, ge=1)


class Copy(Task):
    name = "copy"
    config_class = CopyConfig

    @property
    def vocab_size(self) -> int:
        return self.cfg.n_symbols + 2

    def min_length(self, **cell: Any) -> int:
        return 2 * self.cfg.n_tokens + 1

    def generate(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        n, copy_marker = self.cfg.n_tokens, self.cfg.n_symbols + 1
        data = 1 + random_ints(0, self.cfg.n_symbols, (batch, n), generator)
        spread = length - n - 1  # positions the data is scattered over
        places = torch.rand(batch, spread, generator=generator).argsort(dim=1)[:, :n].sort(dim=1).values
        tokens = torch.zeros(batch, length, dtype=torch.long)
        tokens.scatter_(1, places, data)
        tokens[:, spread] = copy_marker
        tokens[:, spread + 1 :] = data
        answer = torch.zeros(batch, length, dtype=torch.bool)
        answer[:, spread + 1 :] = True
        return tokens, answer
