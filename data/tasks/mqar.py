"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology", §3 and appendix E).

N key-value pairs, then the keys queried again, each answered by its value:

    k_1 v_1 k_2 v_2 .. k_N v_N  0 0 k_3 v_3 0 0 0 k_1 v_1 0 .. 0 k_N v_N 0
    ^^^^^^^^^ context ^^^^^^^^  ^^^ queries in the rest of the sequence; the values there are the answers

As Zoology's reference generator (``zoology/data/associative_recall.py``, ``multiquery_ar``):
- keys and values: N = n_pairs distinct keys from n_keys and N distinct values from n_values (both drawn
  without replacement), keys and values from separate ranges of the vocabulary;
- queries: every key once, in random order, each in its own slot of the rest of the sequence (slots are aligned
  pairs of positions, so queries never overlap). The slot's index s (its gap, in slots, from the context) is
  drawn without replacement with probability proportional to ``power_a * s**(power_a - 1)``, s = 1 .. S:
  Zoology's power law (its default a = 0.01: short gaps more likely, as repeated bigrams are in text);
  ``power_a=1`` draws slots uniformly;
- other positions hold the blank token 0 (Zoology's ``random_non_queries=False``; its random filler would, with
  a vocabulary this small, repeat keys in the filler and make queries ambiguous);
- an answer is a target only: as an input, its position holds the blank 0 (``answer_input``; Zoology's inputs
  have filler there too). Otherwise the values answered so far would tell the later queries which values
  remain, a shortcut without recall (it takes the answer loss from ln N towards ln(N!)/N:
  results/task-defaults/README.md);
- training mixture (``min_pairs``): each training batch draws its number of pairs uniformly from
  [min_pairs, n_pairs], as Zoology trains on a mixture of pair counts (its Figure 2 runs train on 4 to 64 pairs
  at once); evaluation uses n_pairs. Examples with fewer pairs let the recall circuit form sooner.

Vocabulary: blank 0, keys [1, 1 + n_keys), values [1 + n_keys, 1 + n_keys + n_values).
Chance of an exact match (all N values): 1/(n_values (n_values - 1) .. (n_values - N + 1)) guessing among all the
values, 1/N! guessing among the N in context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task, count_mixture


@dataclass
class MQARConfig(GeneratedTaskConfig):
    name: str = "mqar"
    n_pairs: int = domain(8, ge=1)  # key-value pairs per example, each queried once
    n_keys: int = domain(32, ge=1)
    n_values: int = domain(32, ge=1)
    power_a: float = domain(0.01, gt=0, le=1)  # the query gaps' power law (Zoology's a); 1: uniform
    min_pairs: int | None = domain(None, ge=1)  # training batches draw their pairs from [min_pairs, n_pairs]


class MQAR(Task):
    name = "mqar"
    config_class = MQARConfig
    answer_input = 0  # the blank

    def check(self) -> None:
        super().check()
        if self.cfg.min_pairs is not None and self.cfg.min_pairs > self.cfg.n_pairs:
            raise PosGPTError(f"task.min_pairs={self.cfg.min_pairs} is more than task.n_pairs={self.cfg.n_pairs}")
        for kind in ("keys", "values"):
            if self.cfg.n_pairs > getattr(self.cfg, f"n_{kind}"):
                raise PosGPTError(f"task.n_pairs={self.cfg.n_pairs} distinct {kind} need task.n_{kind} >= n_pairs")

    @property
    def vocab_size(self) -> int:
        return 1 + self.cfg.n_keys + self.cfg.n_values

    def min_length(self, n_pairs: int | None = None) -> int:
        return 4 * (n_pairs or self.cfg.n_pairs)

    def training_cell(self, generator: torch.Generator) -> dict[str, int]:
        return count_mixture("n_pairs", self.cfg.min_pairs, self.cfg.n_pairs, generator)

    def generate(
        self, batch: int, length: int, generator: torch.Generator, n_pairs: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c, n = self.cfg, n_pairs or self.cfg.n_pairs
        keys = 1 + torch.rand(batch, c.n_keys, generator=generator).argsort(dim=1)[:, :n]
        values = 1 + c.n_keys + torch.rand(batch, c.n_values, generator=generator).argsort(dim=1)[:, :n]
        order = torch.rand(batch, n, generator=generator).argsort(dim=1)  # the order keys are queried in
        n_slots = (length - 2 * n) // 2
        gap = torch.arange(1, n_slots + 1, dtype=torch.float64)
        weights = (c.power_a * gap ** (c.power_a - 1)).expand(batch, n_slots)
        slots = torch.multinomial(weights, n, replacement=False, generator=generator)  # a slot per query
        tokens = torch.zeros(batch, length, dtype=torch.long)
        answer = torch.zeros(batch, length, dtype=torch.bool)
        tokens[:, 0 : 2 * n : 2], tokens[:, 1 : 2 * n : 2] = keys, values
        query_at = 2 * n + 2 * slots
        tokens.scatter_(1, query_at, keys.gather(1, order))
        tokens.scatter_(1, query_at + 1, values.gather(1, order))
        answer.scatter_(1, query_at + 1, True)
        return tokens, answer
