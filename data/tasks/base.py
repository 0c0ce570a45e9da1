"""What every synthetic task is: a generator of token sequences with its own small vocabulary and a mask of
the answer tokens. A task is a data source like a token split: ``sample(batch, seq_len, generator)`` returns
inputs x and targets y of shape (batch, seq_len), drawn from ``generator`` alone (so a checkpointed
generator state resumes the exact stream of examples), with y = -100 on every position that is not an
answer, so the loss (model/loss.py, ignore_index=-100) and the accuracy cover the answer tokens only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.domain import check_domains
from core.errors import PosGPTError


@dataclass
class TaskConfig:
    """``task=none``: language modelling on data.* (the default). Each task's dataclass extends this one."""

    name: str = "none"


class Task:
    """A generated task. Subclasses set ``name`` and ``config_class`` and implement ``vocab_size``,
    ``min_length`` and ``generate``; ``cells`` names the task's evaluation dimensions besides length."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[TaskConfig]] = TaskConfig
    # Keyword arguments of ``generate`` that evaluation sweeps (passkey: ("depth",)); a value of None: random.
    cells: ClassVar[tuple[str, ...]] = ()
    # The token an answer's own input position holds: None, the answer itself (teacher forcing); a token id, that
    # token instead, where answers seen as inputs would give later answers away (MQAR's distinct values).
    answer_input: ClassVar[int | None] = None

    def __init__(self, cfg: TaskConfig) -> None:
        check_domains(cfg, "task.")  # validation did this at start-up; data/ also runs without it
        self.cfg = cfg

    def check(self) -> None:
        """Raise PosGPTError for settings the format cannot take (called by build_task)."""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def min_length(self) -> int:
        """The shortest sequence (inputs plus the last target) the format fits in."""
        raise NotImplementedError

    def generate(self, batch: int, length: int, generator: torch.Generator, **cell: Any) -> tuple[torch.Tensor, ...]:
        """(tokens, answer): int64 tokens and a bool mask of the answer tokens, both (batch, length)."""
        raise NotImplementedError

    def training_cell(self, generator: torch.Generator) -> dict[str, Any]:
        """Keyword arguments of ``generate`` for one training batch, drawn from ``generator`` (default: none, and
        nothing drawn). A task that trains on a mixture of its settings, as its paper does, draws them here;
        evaluation calls ``generate`` without them, at the task's settings."""
        return {}

    def sample(
        self, batch: int, seq_len: int, generator: torch.Generator, **cell: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs x and next-token targets y, (batch, seq_len) each; y is -100 except on answer tokens."""
        if seq_len + 1 < self.min_length():
            raise PosGPTError(
                f"task={self.name} needs sequences of at least {self.min_length() - 1} tokens with its settings "
                f"(got {seq_len}): raise train.seq_len or shrink the task (configs/task/{self.name}.yaml)"
            )
        tokens, answer = self.generate(batch, seq_len + 1, generator, **cell)
        targets = tokens[:, 1:].masked_fill(~answer[:, 1:], -100)
        inputs = tokens[:, :-1]
        if self.answer_input is not None:
            inputs = inputs.masked_fill(answer[:, :-1], self.answer_input)
        return inputs.contiguous(), targets.contiguous()


def held_out_seed(seed: int, purpose: str) -> int:
    """A seed for a stream other than training's (``purpose``: "val", "eval:..."), derived from the run's seed
    by a hash: reproducible, and unrelated to the training stream, which is seeded with ``seed`` itself."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{purpose}".encode()).digest()[:8], "little") >> 1


def random_ints(low: int, high: torch.Tensor | int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Uniform integers in [low, high) elementwise; ``high`` may be a tensor of per-row bounds."""
    return low + (torch.rand(shape, generator=generator) * (torch.as_tensor(high) - low)).long()
