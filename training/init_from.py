"""Start a run from another run's weights: context extension by fine-tuning (``train.init_from``).

    python train.py train.init_from=<parent run dir> train.seq_len=256 pe.scaling.type=yarn pe.scaling.factor=4

The new run takes the parent's model weights (``checkpoints/last.pt``, or the ``.pt`` file given) and nothing
else: optimizer moments, learning-rate schedule, step, data position and RNG start afresh, as in the
fine-tuning of Chen et al. 2023 (position interpolation, sec. 3) and Peng et al. 2023 (YaRN, sec. 4). It
may train at a longer ``train.seq_len`` and, for a scheme that declares one, with an evaluation-time setting such
as a frequency scaling (``pe.scaling``).

What may differ from the parent: the training itself (``train.*``, ``data``, ``eval``, ``logging``), the
model settings that do not change what the weights compute (``CHANGEABLE_MODEL_KEYS``) and the scheme's
declared evaluation-time settings (``PositionalEncoding.eval_time_settings``, e.g. a rotary scheme's ``scaling``).
Everything else of ``model.*`` and ``pe.*`` must match, or the run is refused with the key named: the planner
checks that when it reads the parent (experiment/plan.py, ``load_parent``), before anything is written. So is a
parameter whose shape changes with ``train.seq_len`` (:meth:`Parent.load_into`): a learned position table has no
rows for positions it never trained, so it cannot be extended by fine-tuning.

What the scheme takes from its parent is the scheme's to say (``PositionalEncoding.inherit``). Frequency scalings
take the length L its frequencies were learned at (model/pe/rope_scaling.py): a model trained at 64 and
extended to 256 with factor 4 keeps L = 64, not 256, so a scaled child that leaves
``pe.scaling.original_seq_len`` null gets its parent's L, recorded in its checkpoint config, from which
eval.py builds the model.

The run records its parent: ``train.init_from`` (made absolute) in its config and checkpoint, and a first
``metrics.jsonl`` record ``{"step": 0, "init_from", "parent_step", "parent_seq_len"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from core.checkpoint_io import WeightsMismatch, checkpoint_file, load_weights
from core.domain import choice
from core.errors import PosGPTError

SCHEME_PREFIX = "pe."  # the scheme's parameters in a model's state dict (GPT.pe)


@dataclass(frozen=True, kw_only=True)
class InitFromSettings:
    """Which run a new run starts from: the ``train.*`` settings declared here (training/settings.py), which the
    planner reads to load and check the :class:`Parent` (experiment/plan.py, load_parent)."""

    init_from: str | None = None  # a run directory (or .pt) whose weights start this run
    # keep: the run has its parent's scheme; replace: another pe=, whose parameters start afresh while every other
    # weight is the parent's (the parent's position parameters are dropped: DroPE, Sakana AI 2025)
    init_from_pe: str = choice("keep", ("keep", "replace"))

    def check(self) -> None:
        """Replacing the scheme needs a parent to replace it in."""
        if self.init_from_pe == "replace" and self.init_from is None:
            raise PosGPTError(
                "train.init_from_pe=replace starts this run's scheme afresh on a parent's other weights: "
                "set train.init_from"
            )


@dataclass
class Parent:
    """The run a new run starts from: its weights and what the new run records about it."""

    path: str
    step: int
    seq_len: int
    state: dict[str, torch.Tensor] = field(repr=False)
    scheme: str = ""  # the parent's pe=
    replaces_scheme: bool = False  # train.init_from_pe=replace: the parent's position parameters are left out

    def record(self) -> dict[str, Any]:
        """The first metrics.jsonl record of the new run."""
        record = {"step": 0, "init_from": self.path, "parent_step": self.step, "parent_seq_len": self.seq_len}
        return {**record, "parent_pe": self.scheme}

    def load_into(self, model: torch.nn.Module, seq_len: int) -> None:
        """Copy the parent's weights into ``model``, built for ``train.seq_len=seq_len``; PosGPTError naming the first
        parameter that does not fit."""
        weights = self.state
        if self.replaces_scheme:  # the scheme's own parameters (the model's ``pe`` module) start as initialised
            kept = {name: w for name, w in self.state.items() if not name.startswith(SCHEME_PREFIX)}
            fresh = {name: w for name, w in model.state_dict().items() if name.startswith(SCHEME_PREFIX)}
            weights = {**kept, **fresh}
        try:
            load_weights(model, weights, checkpoint_file(self.path))
        except WeightsMismatch as mismatch:
            # The architecture matched (check_same_architecture), so a size that differs follows train.seq_len.
            if mismatch.shapes and seq_len != self.seq_len:
                theirs, ours = mismatch.shapes
                raise PosGPTError(
                    f"train.init_from: {mismatch.name} has shape {theirs} in {self.path} but {ours} here: its size "
                    f"follows train.seq_len (parent {self.seq_len}), and positions the parent never trained have no "
                    f"weights, so this scheme cannot be extended by fine-tuning; keep train.seq_len={self.seq_len}"
                ) from None
            raise PosGPTError(f"train.init_from: {mismatch}") from None
        self.state = {}  # not kept for the rest of the run
