"""Flip-flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop Language
Modeling"): a sequence of instructions, each followed by a bit; a read must repeat the last written bit.

    w 1 i 0 i 1 r 1 w 0 i 1 i 1 r 0 ... r b
                  ^           ^          ^ answer tokens: the bit after every r

- instructions: the first is w (write), the last r (read); the others w with probability p_write, r with
  p_read, i (ignore) otherwise (the paper's FFL(p_i=0.8): p_write = p_read = 0.1);
- bits: uniform after w and i; after r, the bit of the latest w (a read's answer is deterministic);
- an odd length starts with one BOS token, so instructions sit at the same parity everywhere.

Vocabulary: w, r, i, 0, 1, BOS. Exact match here: every read of the sequence right (so the longer the
sequence, the more reads it takes; the paper reports the rate of wrong reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.domain import domain
from core.errors import PosGPTError
from data.tasks.base import GeneratedTaskConfig, Task

WRITE, READ, IGNORE, ZERO, BOS = 0, 1, 2, 3, 5


@dataclass
class FlipFlopConfig(GeneratedTaskConfig):
    name: str = "flipflop"
    p_write: float = domain(0.1, gt=0, lt=1)
    p_read: float = domain(0.1, gt=0, lt=1)


class FlipFlop(Task):
    name = "flipflop"
    config_class = FlipFlopConfig

    def check(self) -> None:
        super().check()
        c = self.cfg
        if c.p_write + c.p_read > 1:
            raise PosGPTError(f"task.p_write + task.p_read must be at most 1 (got {c.p_write}, {c.p_read})")

    @property
    def vocab_size(self) -> int:
        return 6

    def min_length(self, **cell: Any) -> int:
        return 4  # w b r b

    def generate(self, batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = length // 2
        draw = torch.rand(batch, pairs, generator=generator)
        bits = torch.randint(0, 2, (batch, pairs), generator=generator)
        instruction = torch.full((batch, pairs), IGNORE)
        instruction[draw < self.cfg.p_write + self.cfg.p_read] = READ
        instruction[draw < self.cfg.p_write] = WRITE
        instruction[:, 0], instruction[:, -1] = WRITE, READ
        index = torch.arange(pairs).expand(batch, pairs)
        last_write = torch.where(instruction == WRITE, index, 0).cummax(dim=1).values
        reads = instruction == READ
        bits = torch.where(reads, bits.gather(1, last_write), bits)
        tokens = torch.stack((instruction, ZERO + bits), dim=2).view(batch, 2 * pairs)
        answer = torch.stack((torch.zeros_like(reads), reads), dim=2).view(batch, 2 * pairs)
        if length % 2:
            tokens = torch.cat((torch.full((batch, 1), BOS), tokens), dim=1)
            answer = torch.cat((torch.zeros(batch, 1, dtype=torch.bool), answer), dim=1)
        return tokens, answer
