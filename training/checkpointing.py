"""Checkpoint and resume: which checkpoint a run continues from, restoring it, and saving only good weights.

A fresh run refuses a directory that already holds a checkpoint; ``train.resume=true`` refuses a checkpoint
trained with other settings than the ones experiment/settings.py declares changeable on resume (the comparison
is the planner's, handed in with :class:`CheckpointSettings`: it reads the checkpoint's config by today's schema).
Only once those checks pass does the run write anything into its directory (:meth:`Checkpointer.record_run`), so a
refused command leaves the run as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from core.checkpoint_io import last_checkpoint_path, load_checkpoint, save_checkpoint
from core.domain import domain
from core.errors import MachineFault, PosGPTError
from core.files import atomic_write, make_folder
from core.rundir import RUN_RECORD_DIR
from data import check_corpus, corpus_identity
from data.config import DataConfig
from training import distributed
from training.optim import OptimizerSettings, lr_multiplier

# What a resume restores besides the weights (Checkpointer.restore); a checkpoint without them cannot continue.
RESUME_STATE = ("optimizer", "scheduler", "rng", "sampler_state")


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    """What the checkpoints of a run hold and how a resume is checked: the ``train.*`` settings declared here
    (training/settings.py), and, without a default, what the planner works out (experiment/plan.py builds it)."""

    keep_checkpoints: int = domain(2, ge=0)  # step checkpoints kept besides last.pt
    resume: bool = False
    config: dict[str, Any] = field(repr=False)  # the run's resolved config, saved in every checkpoint
    config_yaml: str = field(repr=False)  # the same as .hydra/config.yaml holds it
    overrides: tuple[str, ...]  # the command line's
    # The step of the checkpoint a resume was planned from, its settings checked against this run's by the planner
    # (None: no checkpoint was there to resume when the run was planned).
    planned_step: int | None


def resume_checkpoint(settings: CheckpointSettings, run_dir: Path) -> dict | None:
    """The checkpoint to continue from (train.resume=true), or None for a fresh run in an unused directory."""
    path = last_checkpoint_path(run_dir)
    if not settings.resume:
        if path.exists():
            raise PosGPTError(
                f"{run_dir} already holds a checkpoint; pass train.resume=true to continue it, "
                "or choose another hydra.run.dir (nothing was overwritten)"
            )
        return None
    if not path.exists():
        raise PosGPTError(
            f"train.resume=true but {run_dir} holds no checkpoint ({path} is missing); set hydra.run.dir "
            "to the directory of the run to continue, or drop train.resume to start a new one"
        )
    checkpoint = load_checkpoint(path)
    lacking = next((key for key in RESUME_STATE if key not in checkpoint), None)
    if lacking is not None:
        raise PosGPTError(
            f"cannot resume {run_dir}: {path} holds no {lacking} state, only what evaluation needs; start a new run "
            f"from its weights with train.init_from={run_dir} in another hydra.run.dir"
        )
    if checkpoint["step"] != settings.planned_step:  # another command trained it between the plan and the lock
        raise PosGPTError(
            f"cannot resume {run_dir}: its checkpoint is at step {checkpoint['step']}, but the run was planned from "
            f"{'no checkpoint' if settings.planned_step is None else f'step {settings.planned_step}'}; run the "
            "command again"
        )
    return checkpoint


class Checkpointer:
    """Saves the training state of one run (only weights that are finite on every rank), and restores it."""

    def __init__(
        self,
        settings: CheckpointSettings,
        optimizer: OptimizerSettings,
        run_dir: Path,
        checkpoint: dict | None,
        dist: distributed.DistInfo,
        device: torch.device,
    ) -> None:
        self.settings, self.optimizer_settings, self.run_dir = settings, optimizer, run_dir
        self.dist, self.device = dist, device
        self.overrides = settings.overrides
        self.last_saved: int | None = checkpoint["step"] if checkpoint else None
        self.wandb_run_id: str | None = None  # set once the W&B run has started (training.metrics)
        self.corpus: dict | None = None  # data.corpus_identity of the training tokens, set once they are loaded

    def record_run(self) -> None:
        """``.hydra/config.yaml`` and ``overrides.yaml``: the config and command line of the latest (accepted)
        start of this run."""
        if not self.dist.is_main:
            return
        record = self.run_dir / RUN_RECORD_DIR
        make_folder(record, self.run_dir)
        atomic_write(record / "config.yaml", self.settings.config_yaml, self.run_dir)
        atomic_write(record / "overrides.yaml", yaml.safe_dump(list(self.overrides)), self.run_dir)

    def track_corpus(self, splits: dict, checkpoint: dict | None, data: DataConfig) -> None:
        """Record the training tokens' identity in every checkpoint from now on; a resumed run must find the
        tokens its checkpoint was trained on (data.check_corpus names the corpus otherwise)."""
        self.corpus = corpus_identity(splits)
        if checkpoint is not None:
            check_corpus(checkpoint.get("corpus"), splits, data)

    def kept(self) -> str:
        """What is left to resume from, for error messages."""
        if self.last_saved is None:
            return "no checkpoint had been saved yet"
        return f"{last_checkpoint_path(self.run_dir)} still holds the last good checkpoint (step {self.last_saved})"

    def restore(self, checkpoint: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> int:
        """Load a checkpoint's training state into model, optimizer, schedule and RNG; returns its step."""
        distributed.load_full_state_dicts(model, optimizer, checkpoint["model"], checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        step = checkpoint["step"]
        # The learning rate of the next step follows this run's schedule: train.max_steps may have changed.
        for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base_lr * lr_multiplier(step, self.optimizer_settings)
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if self.device.type == "cuda" and checkpoint["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(checkpoint["rng"]["cuda"], self.device)
        if self.dist.is_main:
            print(f"train: resuming {self.run_dir} from step {step}", flush=True)
            planned = checkpoint["config"]["train"]["max_steps"]
            now = self.optimizer_settings.max_steps
            if planned != now:
                print(
                    f"train: train.max_steps is now {now} (was {planned}): the learning-rate schedule follows the new "
                    "value from here on",
                    flush=True,
                )
        return step

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        sampler_state: torch.Tensor,
    ) -> None:
        """Write last.pt (collective under torchrun); refuses weights that are not finite."""
        if not _weights_finite(model, self.dist, self.device):
            raise PosGPTError(
                f"the weights became non-finite by step {step} and were not saved; {self.kept()}. "
                f"Lower train.lr (now {self.optimizer_settings.lr})"
            )
        model_state, optim_state = distributed.full_state_dicts(model, optimizer)
        if self.dist.is_main:
            state: dict[str, Any] = {
                "model": model_state,
                "optimizer": optim_state,
                "scheduler": scheduler.state_dict(),
                "step": step,
                "config": self.settings.config,
                "overrides": list(self.overrides),
                "rng": {
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
                },
                "sampler_state": sampler_state,
                "wandb_run_id": self.wandb_run_id,
                "corpus": self.corpus,
            }
            try:
                save_checkpoint(state, self.run_dir, keep=self.settings.keep_checkpoints)
            except MachineFault as fault:
                raise MachineFault(f"{fault}; {self.kept()}") from None
        self.last_saved = step


def _weights_finite(model: torch.nn.Module, dist: distributed.DistInfo, device: torch.device) -> bool:
    """Whether every parameter is finite on every rank (collective under torchrun)."""
    bad = any(not torch.isfinite(distributed.local_tensor(p)).all() for p in model.parameters())
    return not distributed.any_rank(bad, dist, device)
