"""Variable tracking (RULER's multi-hop tracing, Hsieh et al. 2024, §3.1): chains of assignments X1 = 7, X2 = X1,
X3 = X2 are scattered in filler; the query names a value, and every variable that holds it must be listed.

    f f LET x_1 7 f LET y_1 4 f f LET x_2 x_1 f LET y_2 y_1 f ... f QUERY 7 x_1 x_2
                                                                            ^^^^^^^ answer tokens: the chain's
                                                                            variables, in assignment order

- chains: n_chains chains of n_hops + 1 distinct variables (from n_var_symbols); the first variable of a chain
  is assigned a value (distinct across chains, from n_symbols), each next one the previous variable;
- statements (LET target source, three tokens) at random, non-overlapping places of the context; each chain's
  statements in its order, the chains interleaved at random; the queried chain drawn uniformly, the others
  distractors. A longer instance has more filler between the statements (they stay the same).

Vocabulary: values [0, n_symbols), variables [n_symbols, n_symbols + n_var_symbols), filler (filler_len), LET,
QUERY. Chance of an exact match: 1/n_chains choosing a chain in context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task, non_overlapping_starts, random_ints

STATEMENT = 3  # LET target source


@dataclass
class VarTrackConfig(GeneratedTaskConfig):
    name: str = "vartrack"
    n_chains: int = domain(2, ge=1)  # chains in context: one queried, the others distractors
    n_hops: int = domain(2, ge=1)  # assignments of a variable to a variable, per chain
    n_symbols: int = domain(10, ge=1)  # the values
    n_var_symbols: int = domain(16, ge=1)  # the variables' names
    filler_len: int = domain(5, ge=1)


class VarTrack(Task):
    name = "vartrack"
    config_class = VarTrackConfig

    def check(self) -> None:
        super().check()
        c = self.cfg
        if c.n_chains * (c.n_hops + 1) > c.n_var_symbols:
            raise PosGPTError(
                f"task.n_chains={c.n_chains} chains of task.n_hops={c.n_hops} + 1 distinct variables need "
                f"task.n_var_symbols >= {c.n_chains * (c.n_hops + 1)} (got {c.n_var_symbols})"
            )
        if c.n_chains > c.n_symbols:
            raise PosGPTError(f"task.n_chains={c.n_chains} distinct values need task.n_symbols >= n_chains")

    @property
    def vocab_size(self) -> int:
        c = self.cfg
        return c.n_symbols + c.n_var_symbols + c.filler_len + 2

    def min_length(self, **cell: Any) -> int:
        c = self.cfg
        return c.n_chains * (c.n_hops + 1) * STATEMENT + 2 + c.n_hops + 1

    def generate(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        c, chain = self.cfg, self.cfg.n_hops + 1
        let = c.n_symbols + c.n_var_symbols + c.filler_len
        context, statements = length - 2 - chain, c.n_chains * chain
        names = torch.rand(batch, c.n_var_symbols, generator=generator).argsort(dim=1)[:, :statements]
        variables = (c.n_symbols + names).view(batch, c.n_chains, chain)
        values = torch.rand(batch, c.n_symbols, generator=generator).argsort(dim=1)[:, : c.n_chains]
        sources = torch.cat((values.unsqueeze(2), variables[:, :, :-1]), dim=2)  # what each variable is assigned
        # the statement slots in context order, dealt to the chains at random, each chain's in its own order
        slots = torch.rand(batch, statements, generator=generator).argsort(dim=1).view(batch, c.n_chains, chain)
        starts = non_overlapping_starts(batch, context, statements, STATEMENT, generator)
        at = starts.gather(1, slots.sort(dim=2).values.flatten(1))
        queried = random_ints(0, c.n_chains, (batch, 1), generator)
        tokens = (c.n_symbols + c.n_var_symbols + torch.arange(length) % c.filler_len).repeat(batch, 1)
        lets = torch.stack((torch.full_like(variables, let), variables, sources), dim=3).flatten(1)
        tokens.scatter_(1, (at.unsqueeze(2) + torch.arange(STATEMENT)).flatten(1), lets)
        tokens[:, context] = let + 1
        tokens[:, context + 1] = values.gather(1, queried)[:, 0]
        tokens[:, context + 2 :] = variables[torch.arange(batch), queried[:, 0]]
        answer = torch.zeros(batch, length, dtype=torch.bool)
        answer[:, context + 2 :] = True
        return tokens, answer
