"""Aggregation (RULER's common/frequent words extraction, Hsieh et al. 2024, §3.1): symbols are strewn over the
context, a few of them twice as often as the others; the query asks for those frequent symbols.

    s_3 s_1 s_5 . s_3 s_0 s_2 s_3 . s_6 s_1 s_3 ... QUERY s_1 s_3
                                                          ^^^^^^^ answer tokens: the frequent symbols,
                                                          ascending

- counts: n_frequent frequent symbols (drawn from n_symbols) occur 2a times each and every other symbol a times,
  a the largest count the context holds (at least 1); the positions left over hold a blank (.); all in a random
  order. A longer instance has a larger a: more of every symbol, the same gap between the two kinds (x2);
- answer: the frequent symbols in ascending order, so that an exact match has one right answer.

Vocabulary: symbols [0, n_symbols), blank, QUERY. Chance of an exact match: 1/C(n_symbols, n_frequent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task

RATIO = 2  # a frequent symbol occurs RATIO times as often as any other


@dataclass
class AggregationConfig(GeneratedTaskConfig):
    name: str = "aggregation"
    n_symbols: int = domain(8, ge=2)
    n_frequent: int = domain(2, ge=1)  # the symbols to report


class Aggregation(Task):
    name = "aggregation"
    config_class = AggregationConfig

    def check(self) -> None:
        super().check()
        if self.cfg.n_frequent >= self.cfg.n_symbols:
            raise PosGPTError(
                f"task.n_frequent={self.cfg.n_frequent} must be below task.n_symbols={self.cfg.n_symbols} "
                "(some symbols must be rare)"
            )

    @property
    def vocab_size(self) -> int:
        return self.cfg.n_symbols + 2

    def _units(self) -> int:
        """Context tokens per unit of the count a: RATIO for each frequent symbol, 1 for each other."""
        return RATIO * self.cfg.n_frequent + self.cfg.n_symbols - self.cfg.n_frequent

    def min_length(self, **cell: Any) -> int:
        return self._units() + 1 + self.cfg.n_frequent

    def generate(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        c, blank = self.cfg, self.cfg.n_symbols
        context = length - 1 - c.n_frequent
        a = context // self._units()
        frequent = torch.rand(batch, c.n_symbols, generator=generator).argsort(dim=1)[:, : c.n_frequent]
        counts = torch.full((batch, c.n_symbols), a).scatter_(1, frequent, RATIO * a)
        symbols = torch.arange(c.n_symbols).expand(batch, -1)
        # each row: every symbol as often as its count, then blanks, in a random order
        bag = torch.full((batch, context), blank)
        filled = torch.repeat_interleave(symbols.flatten(), counts.flatten()).view(batch, -1)
        bag[:, : filled.shape[1]] = filled
        order = torch.rand(batch, context, generator=generator).argsort(dim=1)
        tokens = torch.cat((bag.gather(1, order), torch.full((batch, 1), blank + 1), frequent.sort(dim=1).values), 1)
        answer = torch.zeros(batch, length, dtype=torch.bool)
        answer[:, context + 1 :] = True
        return tokens, answer
