"""A run directory holding an untrained tiny model's checkpoint, made in-process in well under a second.

For tests of the tools that read a run (sample.py, scripts/inspect_attention.py): what they compute does not
need trained weights, and training one would cost a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.builders import build_model
from core.checkpoint import save_checkpoint
from core.config import register_configs
from cli_runs import REPO, TINY


def make_run(run_dir: Path, corpus: Path, *overrides: str, seed: int = 0) -> Path:
    """A run directory as train.py leaves it (checkpoint only), for the TINY settings plus ``overrides``."""
    overrides = [*TINY, f"data.files=[{corpus}]", *overrides]
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides=overrides)
    torch.manual_seed(seed)
    model = build_model(cfg)
    state = {"model": model.state_dict(), "step": 0, "config": OmegaConf.to_container(cfg, resolve=True),
             "overrides": overrides, "wandb_run_id": None}
    save_checkpoint(state, run_dir, keep=0)
    return run_dir
