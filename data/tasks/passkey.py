"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", §4.2): a key hidden at some depth in
filler text must be repeated at the end.

The paper hides "The pass key is 71432. Remember it." in repetitions of fixed filler sentences ("The grass is
green. The sky is blue. ...") and asks for the key at the end. Here, with a vocabulary of its own:

    f f f ... f KEY k_1 .. k_K f ... f QUERY k_1 .. k_K
                                             ^^^^^^^^^^^ answer tokens (the last K)

- key: K = key_len symbols drawn uniformly from n_symbols (the paper's 5 digits: K=5, n_symbols=10);
- filler: one fixed "sentence" of filler_len distinct tokens repeated, its cycle running on across the key
  (filler_len=1 is a single repeated token);
- depth: the share of the filler before the key, 0 (the key first) to 1 (the key just before the query);
  drawn uniformly per example in training, set per cell in the evaluation's depth × length grid.

Vocabulary: symbols [0, n_symbols), filler [n_symbols, n_symbols + filler_len), KEY, QUERY.
Chance of an exact match: n_symbols^-K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task, random_ints


@dataclass
class PasskeyConfig(GeneratedTaskConfig):
    name: str = "passkey"
    key_len: int = domain(4, ge=1)  # symbols in the key
    n_symbols: int = domain(10, ge=1)  # the key's alphabet (digits)
    filler_len: int = domain(5, ge=1)  # tokens in the repeated filler sentence


class Passkey(Task):
    name = "passkey"
    config_class = PasskeyConfig
    cells = ("depth",)

    @property
    def vocab_size(self) -> int:
        return self.cfg.n_symbols + self.cfg.filler_len + 2

    def min_length(self, **cell: Any) -> int:
        return 2 * self.cfg.key_len + 2

    def generate(
        self, batch: int, length: int, generator: torch.Generator, depth: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cfg
        key_marker, query_marker = c.n_symbols + c.filler_len, c.n_symbols + c.filler_len + 1
        n_filler = length - 2 * c.key_len - 2
        key = random_ints(0, c.n_symbols, (batch, c.key_len), generator)
        if depth is None:
            start = random_ints(0, n_filler + 1, (batch, 1), generator)  # KEY's position = filler tokens before it
        elif 0 <= depth <= 1:
            start = torch.full((batch, 1), round(depth * n_filler))
        else:
            raise PosGPTError(f"a passkey depth is a share of the filler, in [0, 1] (got {depth})")
        pos = torch.arange(length).expand(batch, length)
        query = n_filler + c.key_len + 1  # the QUERY marker's position
        filler_index = torch.where(pos < start, pos, pos - c.key_len - 1)
        tokens = c.n_symbols + filler_index % c.filler_len
        in_key = (pos > start) & (pos <= start + c.key_len)
        tokens = torch.where(in_key, key.gather(1, (pos - start - 1).clamp(0, c.key_len - 1)), tokens)
        answer = pos > query
        tokens = torch.where(answer, key.gather(1, (pos - query - 1).clamp(0, c.key_len - 1)), tokens)
        tokens = tokens.masked_fill(pos == start, key_marker).masked_fill(pos == query, query_marker)
        return tokens, answer
