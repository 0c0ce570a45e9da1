"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology", §3 and appendix E).

N key-value pairs, then the keys queried again, each followed by its value:

    k_1 v_1 k_2 v_2 .. k_N v_N  0 0 k_3 v_3 0 0 0 k_1 v_1 0 .. 0 k_N v_N 0
    ^^^^^^^^^ context ^^^^^^^^  ^^^ queries at random places in the rest; the values there are the answers

- keys: N = n_pairs distinct keys from n_keys, values uniform from n_values (may repeat), as in Zoology;
- queries: every key once, in random order, each at a random slot of the rest of the sequence (Zoology draws
  query positions from a power law favouring short gaps; here uniform, so the gaps grow with the length);
  slots are aligned pairs of positions, so queries never overlap; other positions hold the blank token 0.

Vocabulary: blank 0, keys [1, 1 + n_keys), values [1 + n_keys, 1 + n_keys + n_values).
Chance of an exact match (all N values): n_values^-N.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import Task, TaskConfig, random_ints


@dataclass
class MQARConfig(TaskConfig):
    name: str = "mqar"
    n_pairs: int = domain(8, ge=1)  # key-value pairs per example, each queried once
    n_keys: int = domain(32, ge=1)
    n_values: int = domain(32, ge=1)


class MQAR(Task):
    name = "mqar"
    config_class = MQARConfig

    def check(self) -> None:
        if self.cfg.n_pairs > self.cfg.n_keys:
            raise PosGPTError(f"task.n_pairs={self.cfg.n_pairs} distinct keys need task.n_keys >= n_pairs")

    @property
    def vocab_size(self) -> int:
        return 1 + self.cfg.n_keys + self.cfg.n_values

    def min_length(self) -> int:
        return 4 * self.cfg.n_pairs

    def generate(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        c, n = self.cfg, self.cfg.n_pairs
        keys = 1 + torch.rand(batch, c.n_keys, generator=generator).argsort(dim=1)[:, :n]
        values = 1 + c.n_keys + random_ints(0, c.n_values, (batch, n), generator)
        order = torch.rand(batch, n, generator=generator).argsort(dim=1)  # the order keys are queried in
        n_slots = (length - 2 * n) // 2
        slots = torch.rand(batch, n_slots, generator=generator).argsort(dim=1)[:, :n]  # a slot per query
        tokens = torch.zeros(batch, length, dtype=torch.long)
        answer = torch.zeros(batch, length, dtype=torch.bool)
        tokens[:, 0 : 2 * n : 2], tokens[:, 1 : 2 * n : 2] = keys, values
        query_at = 2 * n + 2 * slots
        tokens.scatter_(1, query_at, keys.gather(1, order))
        tokens.scatter_(1, query_at + 1, values.gather(1, order))
        answer.scatter_(1, query_at + 1, True)
        return tokens, answer
