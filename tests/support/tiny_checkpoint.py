"""A run directory holding an untrained tiny model's checkpoint, made in-process in well under a second.

For tests of the tools that read a run (sample.py, scripts/inspect_attention.py): what they compute does not
need trained weights, and training one would cost a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import torch
from cli_runs import TINY
from omegaconf import OmegaConf

from core.checkpoint_io import save_checkpoint
from experiment.build import build_model
from experiment.compose import compose_config
from experiment.config import set_task_vocabulary


def make_run(run_dir: Path, corpus: Path, *overrides: str, seed: int = 0) -> Path:
    """A run directory as train.py leaves it (checkpoint only), for the TINY settings plus ``overrides``."""
    overrides = [*TINY, f"data.files=[{corpus}]", *overrides]
    cfg = compose_config(overrides)
    set_task_vocabulary(cfg)  # a task run's model has the task's vocabulary, as train.py's plan sets it
    torch.manual_seed(seed)
    model = build_model(cfg)
    state = {
        "model": model.state_dict(),
        "step": 0,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "overrides": overrides,
        "wandb_run_id": None,
    }
    save_checkpoint(state, run_dir, keep=0)
    return run_dir
