"""Needle retrieval among distractors (RULER's multi-key, multi-value and multi-query needles, Hsieh et al. 2024,
§3.1): several key-value needles are hidden in filler; a query names one key, and all of its values must be repeated.

    f f f KEY k_a v v f f KEY k_b v v f f f f ... f QUERY k_b v v
                                                               ^^^ answer tokens: the queried key's values, in order

- needles: n_keys distinct keys (from n_key_symbols), each followed by n_values values drawn uniformly from
  n_symbols; n_keys > 1 is RULER's multi-key needle (the other keys are distractors), n_values > 1 its
  multi-value needle (every value of the key must come back);
- queries: n_queries distinct needles are queried in turn at the end (``QUERY k_b v v QUERY k_a v v``), RULER's
  multi-query needle; every queried value is an answer token. One query gives one lookup's supervision per instance;
  MQAR's 8 queries give eight;
- filler: one fixed "sentence" of filler_len distinct tokens repeated, as passkey's;
- placement: the needles at random, non-overlapping places of the context, in any order; the queried needle
  drawn uniformly among them. A longer instance has more filler between the needles (they stay the same);
- answers as inputs (``hide_answers``): false, each answer token is the next position's input (teacher forcing), so
  with several queries the values already answered tell a later query which needles remain, and the last query is
  answered by elimination without matching its key (measured: results/ruler-defaults); true, an answer's input
  position holds a blank token instead, as MQAR's does (``Task.answer_input``), so that every query needs the lookup;
- training mixture (``min_keys``): each training batch draws its number of needles uniformly from
  [min_keys, n_keys], as MQAR's ``min_pairs``; evaluation uses n_keys. With one needle the task is a passkey,
  which forms the retrieval circuit that the distractors then teach to select by key. A batch with fewer needles
  than n_queries queries each of them once.

Vocabulary: values [0, n_symbols), keys [n_symbols, n_symbols + n_key_symbols), filler (filler_len), KEY, QUERY,
and with ``hide_answers`` the blank.
Chance of an exact match with one query: 1/n_keys choosing among the needles in context, n_symbols^-n_values
guessing; with several, every query must be right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task, count_mixture, non_overlapping_starts, random_ints


@dataclass
class NeedlesConfig(GeneratedTaskConfig):
    name: str = "needles"
    n_keys: int = domain(4, ge=1)  # needles in context: one queried, the others distractors
    n_values: int = domain(2, ge=1)  # values per needle, all to be repeated
    n_symbols: int = domain(10, ge=1)  # the values' alphabet
    n_key_symbols: int = domain(16, ge=1)  # the keys' alphabet
    filler_len: int = domain(5, ge=1)
    min_keys: int | None = domain(None, ge=1)  # training batches draw their needles from [min_keys, n_keys]
    n_queries: int = domain(1, ge=1)  # distinct needles queried in turn at the end (at most n_keys)
    hide_answers: bool = False  # true: an answer's input position holds a blank, not the answer (module docstring)


class Needles(Task):
    name = "needles"
    config_class = NeedlesConfig

    def check(self) -> None:
        super().check()
        if self.cfg.n_keys > self.cfg.n_key_symbols:
            raise PosGPTError(
                f"task.n_keys={self.cfg.n_keys} distinct keys need task.n_key_symbols >= n_keys "
                f"(got {self.cfg.n_key_symbols})"
            )
        if self.cfg.min_keys is not None and self.cfg.min_keys > self.cfg.n_keys:
            raise PosGPTError(f"task.min_keys={self.cfg.min_keys} is more than task.n_keys={self.cfg.n_keys}")
        if self.cfg.n_queries > self.cfg.n_keys:
            raise PosGPTError(
                f"task.n_queries={self.cfg.n_queries} distinct needles to query need task.n_keys >= n_queries "
                f"(got {self.cfg.n_keys})"
            )

    @property
    def vocab_size(self) -> int:
        c = self.cfg
        return c.n_symbols + c.n_key_symbols + c.filler_len + 2 + (1 if c.hide_answers else 0)

    @property
    def answer_input(self) -> int | None:  # type: ignore[override]  # Task's class-level setting, per config here
        return self.vocab_size - 1 if self.cfg.hide_answers else None  # the blank, the last id

    def min_length(self, n_keys: int | None = None) -> int:
        n = n_keys or self.cfg.n_keys
        return (n + min(self.cfg.n_queries, n)) * (2 + self.cfg.n_values)

    def training_cell(self, generator: torch.Generator) -> dict[str, int]:
        return count_mixture("n_keys", self.cfg.min_keys, self.cfg.n_keys, generator)

    def generate(
        self, batch: int, length: int, generator: torch.Generator, n_keys: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c, size, n = self.cfg, 2 + self.cfg.n_values, n_keys or self.cfg.n_keys
        key_marker, n_queries = c.n_symbols + c.n_key_symbols + c.filler_len, min(c.n_queries, n)
        context = length - n_queries * size  # the queries and their answers close the instance
        keys = c.n_symbols + torch.rand(batch, c.n_key_symbols, generator=generator).argsort(dim=1)[:, :n]
        values = random_ints(0, c.n_symbols, (batch, n, c.n_values), generator)
        starts = non_overlapping_starts(batch, context, n, size, generator)
        if n_queries == 1:  # one draw, as before n_queries existed: one query's instances stay what they were
            queried = random_ints(0, n, (batch, 1), generator)
        else:
            queried = torch.rand(batch, n, generator=generator).argsort(dim=1)[:, :n_queries]
        tokens = (c.n_symbols + c.n_key_symbols + torch.arange(length) % c.filler_len).repeat(batch, 1)
        needles = torch.cat((torch.full((batch, n, 1), key_marker), keys.unsqueeze(2), values), dim=2)
        tokens.scatter_(1, (starts.unsqueeze(2) + torch.arange(size)).flatten(1), needles.flatten(1))
        queries = needles.gather(1, queried.unsqueeze(2).expand(-1, -1, size)).clone()
        queries[:, :, 0] = key_marker + 1  # QUERY k v..: the needle with its marker replaced
        tokens[:, context:] = queries.flatten(1)
        answer = torch.zeros(batch, n_queries, size, dtype=torch.bool)
        answer[:, :, 2:] = True  # the values of each query
        return tokens, torch.cat((torch.zeros(batch, context, dtype=torch.bool), answer.flatten(1)), dim=1)
