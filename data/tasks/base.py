"""What every synthetic task is: a generator of token sequences with its own small vocabulary and a mask of
the answer tokens. A task is a data source like a token split: ``sample(batch, seq_len, generator)`` returns
inputs x and targets y of shape (batch, seq_len), drawn from ``generator`` alone (so a checkpointed
generator state resumes the exact stream of examples), with y = -100 on every position that is not an
answer, so the loss (model/loss.py, ignore_index=-100) and the accuracy cover the answer tokens only.

Training lengths. As in the length-generalisation literature (Ruoss et al. 2023 draw each training instance's
length uniformly from [1, N]; Kazemnejad et al. 2023 train on every length up to the training length), a
training batch (``training_batch``) holds instances of every length the task's format fits, up to seq_len,
drawn uniformly per instance (``task.train_lengths=uniform``, the default). Each instance starts at position 0
and is padded on the right up to seq_len; a pad is never a target, and under causal attention no instance token
sees one, so a shorter instance is computed exactly as it would be alone. Without this a run learns the one
layout of its training length and fails *below* it, and "extrapolation" then measures that shortcut.
``task.train_lengths=fixed`` trains at exactly seq_len (the protocol before this setting existed; checkpoints
without the key were trained so). Evaluation always scores instances of exactly the evaluated length.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.domain import COMMANDS, check_domains, choice, read_with
from core.errors import PosGPTError

TRAIN_LENGTHS = ("uniform", "fixed")


@dataclass
class TaskConfig:
    """``task=none``: language modelling on data.* (the default)."""

    # the kind of run: every command reads it (sample.py and the scripts refuse a task run)
    name: str = read_with("none", commands=tuple(COMMANDS))


@dataclass
class GeneratedTaskConfig(TaskConfig):
    """What every generated task has; each task's dataclass extends this one."""

    # uniform: each training instance's length drawn uniformly from the lengths the format fits, up to
    # train.seq_len; fixed: every instance exactly train.seq_len long (one layout only)
    train_lengths: str = choice("uniform", TRAIN_LENGTHS)


class Task:
    """A generated task. Subclasses set ``name`` and ``config_class`` and implement ``vocab_size``,
    ``min_length`` and ``generate``; ``cells`` names the task's evaluation dimensions besides length."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[GeneratedTaskConfig]] = GeneratedTaskConfig
    # Keyword arguments of ``generate`` that evaluation sweeps (passkey: ("depth",)); a value of None: random.
    cells: ClassVar[tuple[str, ...]] = ()
    # The token an answer's own input position holds: None, the answer itself (teacher forcing); a token id, that
    # token instead, where answers seen as inputs would give later answers away (MQAR's distinct values).
    answer_input: ClassVar[int | None] = None

    # Settings added since task checkpoints were first written, with the value those checkpoints were trained with.
    legacy_values: ClassVar[dict[str, Any]] = {"train_lengths": "fixed"}

    def __init__(self, cfg: GeneratedTaskConfig) -> None:
        check_domains(cfg, "task.")  # validation did this at start-up; data/ also runs without it
        self.cfg = cfg

    def check(self) -> None:
        """Raise PosGPTError for settings the format cannot take (called by build_task). A subclass that overrides
        it calls this one too."""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def min_length(self, **cell: Any) -> int:
        """The shortest sequence (inputs plus the last target) the format fits in, at the task's settings or at
        those of ``cell`` (a training mixture's draw)."""
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
        """Inputs x and next-token targets y, (batch, seq_len) each, every instance exactly seq_len long; y is -100
        except on answer tokens."""
        self.check_fits(seq_len, **cell)
        return self._inputs_and_targets(*self.generate(batch, seq_len + 1, generator, **cell))

    def training_batch(self, batch: int, seq_len: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch as ``sample``'s, at the settings ``training_cell`` draws; under train_lengths=uniform
        each row an instance of a length drawn uniformly from [min_length, seq_len + 1] tokens, padded on the
        right (the pads' targets -100)."""
        x, y, _ = self.training_instances(batch, seq_len, generator)
        return x, y

    def training_instances(
        self, batch: int, seq_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``training_batch``'s x and y, and how many input tokens of each row are its instance's (the rest pads)."""
        cell = self.training_cell(generator)
        if self.cfg.train_lengths == "fixed":
            return *self.sample(batch, seq_len, generator, **cell), torch.full((batch,), seq_len)
        self.check_fits(seq_len, **cell)
        lengths = torch.randint(self.min_length(**cell), seq_len + 2, (batch,), generator=generator)
        tokens = torch.zeros(batch, seq_len + 1, dtype=torch.long)
        answer = torch.zeros(batch, seq_len + 1, dtype=torch.bool)
        for length in lengths.unique().tolist():  # ascending: the draws' order is fixed by the lengths alone
            rows = (lengths == length).nonzero().squeeze(1)
            tokens[rows, :length], answer[rows, :length] = self.generate(len(rows), length, generator, **cell)
        return *self._inputs_and_targets(tokens, answer), lengths - 1  # an instance of n tokens: n - 1 inputs

    def check_fits(self, seq_len: int, **cell: Any) -> None:
        """PosGPTError unless the format fits sequences of ``seq_len`` tokens (the training length; an evaluation's
        lengths are checked at plan time: evaluation/settings.py), at the task's settings or ``cell``'s."""
        if seq_len + 1 < self.min_length(**cell):
            raise PosGPTError(
                f"task={self.name} needs train.seq_len >= {self.min_length(**cell) - 1} with its settings (got "
                f"{seq_len}): raise train.seq_len or shrink the task (configs/task/{self.name}.yaml)"
            )

    def _inputs_and_targets(self, tokens: torch.Tensor, answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        targets = tokens[:, 1:].masked_fill(~answer[:, 1:], -100)
        inputs = tokens[:, :-1]
        if self.answer_input is not None:
            inputs = inputs.masked_fill(answer[:, :-1], self.answer_input)
        return inputs.contiguous(), targets.contiguous()


def held_out_seed(seed: int, purpose: str) -> int:
    """A seed for a stream other than training's (``purpose``: "val", "eval:..."), derived from the run's seed
    by a hash: reproducible, and unrelated to the training stream, which is seeded with ``seed`` itself."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{purpose}".encode()).digest()[:8], "little") >> 1


def count_mixture(key: str, low: int | None, high: int, generator: torch.Generator) -> dict[str, int]:
    """A training cell (``Task.training_cell``) whose ``key`` is drawn uniformly from [low, high], the mixture of
    counts a task's paper trains on; {} and nothing drawn from ``generator`` when ``low`` is None or ``high``."""
    if low is None or low == high:
        return {}
    return {key: low + int(torch.randint(0, high - low + 1, (), generator=generator))}


def random_ints(low: int, high: torch.Tensor | int, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Uniform integers in [low, high) elementwise; ``high`` may be a tensor of per-row bounds."""
    return low + (torch.rand(shape, generator=generator) * (torch.as_tensor(high) - low)).long()


def non_overlapping_starts(batch: int, room: int, count: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, count) sorted starts of ``count`` blocks of ``size`` tokens at random in ``room`` tokens, none
    overlapping: ``count`` distinct sorted offsets among room - count * (size - 1), each block shifting the next."""
    free = room - count * (size - 1)
    offsets = torch.rand(batch, free, generator=generator).argsort(dim=1)[:, :count].sort(dim=1).values
    return offsets + torch.arange(count) * (size - 1)
