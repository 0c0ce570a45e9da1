"""The trained run an evaluation scores, in one object: built once (by eval.py, or by training when it ends) and
handed to every evaluator (perplexity by protocol, task accuracy, the copy probe), so that none of them rebuilds
the lengths, reaches into another's module, or takes a dozen loose arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from core.rundir import EVAL_DIR
from experiment.config import eval_lengths
from model.temperature import temperature_settings


@dataclass
class EvalContext:
    """``cfg``: the trained config with the evaluation's overrides (experiment/settings.py allows only those that
    leave the trained function unchanged: eval.*, data.*, logging.*, the scheme's evaluation-time settings);
    ``trained_config``: what the checkpoint records, written into every results document; ``step``: the
    checkpoint's training step; ``lengths``: the evaluated lengths, resolved once."""

    cfg: DictConfig
    model: torch.nn.Module
    run_dir: Path
    device: torch.device
    dtype: torch.dtype
    trained_config: dict[str, Any]
    step: int
    lengths: list[int]
    wandb_run: Any = None

    @classmethod
    def of(
        cls,
        cfg: DictConfig,
        model: torch.nn.Module,
        run_dir: str | Path,
        device: torch.device,
        dtype: torch.dtype,
        trained_config: dict[str, Any],
        step: int | None = None,
        wandb_run: Any = None,
    ) -> EvalContext:
        """The context of a run; ``step`` None: training just ended, at ``train.max_steps``."""
        step = cfg.train.max_steps if step is None else step
        return cls(cfg, model, Path(run_dir), device, dtype, trained_config, step, eval_lengths(cfg), wandb_run)

    @property
    def eval_dir(self) -> Path:
        return self.run_dir / EVAL_DIR

    @property
    def progress(self) -> bool:
        return bool(self.cfg.logging.progress)

    def variations(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each of the scheme's evaluation-time variations asked for (eval.variations, else the run as configured),
        applied to the model while the caller scores it: yields its label and the fields a row records of it."""
        for label, settings in self.model.pe.eval_variations(list(self.cfg.eval.variations or [])):
            with self.model.pe.evaluated_with(settings):
                yield label, variation_fields(label, settings, self.cfg)


def as_plain(value: Any) -> Any:
    """A setting's value as JSON can hold it (a dataclass, such as a scheme's nested config, becomes a dict)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def variation_fields(label: str, settings: dict[str, Any], cfg: DictConfig) -> dict[str, Any]:
    """What a result row (perplexity, task, copy probe) records of what its model was evaluated with besides its
    weights: the scheme's evaluation-time variation (its label and settings) and the attention temperature."""
    return {
        "variation": label,
        "variation_settings": {name: as_plain(value) for name, value in settings.items()},
        "attn_temperature": temperature_settings(cfg.model.attn_temperature),
    }
