"""Evaluate a trained run at many context lengths (the length-extrapolation curve).

    python eval.py run_dir=outputs/2026-11-22/10-00-00-rope
    python eval.py run_dir=... eval.lengths=[64,256,1024] eval.protocols=[sliding] eval.stride=16
    python eval.py run_dir=... pe.scaling.type=yarn pe.scaling.factor=8     # RoPE context extension
    python eval.py run_dir=... eval.scalings=[none,yarn:8,ntk:8,linear:8]   # several in one go
    python eval.py run_dir=... data=text data.files=[/path/to/book.txt]     # another corpus

The run's config is recomposed from the overrides it was trained with, then the ones given here are
applied on top, so every config group (data, eval, logging, pe.scaling) works exactly as in train.py.
Results land in <run_dir>/eval/ (added to what earlier evaluations of the same checkpoint wrote there: see
evaluation/report.py) and in the training run's W&B run.

The training corpus is scored on its validation split; another corpus is scored whole (up to
eval.max_tokens), in rows labelled with data.name ("text" for data=text unless set: name each corpus).
data.eval_split=val|train|all chooses the split instead; each row records its corpus, split and tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.builders import build_model
from core.checkpoint import load_checkpoint
from core.cli import exit_on_user_error
from core.config import register_configs, validate
from core.errors import PosGPTError
from core.runtime import configure_backends, select_device, select_dtype
from core.tracking import init_wandb
from data import eval_tokens
from evaluation.run import run_extrapolation_eval

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# What a checkpoint's weights depend on: eval overrides may not change these.
ARCHITECTURE_KEYS = ("model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.bias",
                     "pe.name", "train.seq_len")

USAGE = "usage: python eval.py run_dir=<training run directory> [hydra overrides, e.g. eval.lengths=[64,512]]"


def compose_eval_config(checkpoint: dict, overrides: list[str]) -> DictConfig:
    """The training run's config, recomposed from its own overrides, with ``overrides`` applied last."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        try:
            cfg = compose("config", overrides=list(checkpoint.get("overrides", [])) + overrides)
        except (HydraException, OmegaConfBaseException) as error:
            # e.g. pe.scaling.* on a run whose scheme has no scaling: Hydra's message names the key.
            raise PosGPTError(f"cannot apply the overrides {overrides}: {error}") from None
    trained = OmegaConf.create(checkpoint["config"])
    for key in ARCHITECTURE_KEYS:
        if OmegaConf.select(cfg, key) != OmegaConf.select(trained, key):
            raise PosGPTError(f"{key} is {OmegaConf.select(trained, key)} in the checkpoint; eval cannot change it")
    return cfg


def parse_args(argv: list[str]) -> tuple[Path, list[str]]:
    run_dirs = [a for a in argv if a.startswith("run_dir=")]
    if len(run_dirs) != 1 or any(a in ("-h", "--help") for a in argv):
        raise PosGPTError(USAGE)
    return Path(run_dirs[0].split("=", 1)[1]), [a for a in argv if not a.startswith("run_dir=")]


@exit_on_user_error
def main(argv: list[str]) -> None:
    run_dir, overrides = parse_args(argv)
    checkpoint = load_checkpoint(run_dir)
    cfg = compose_eval_config(checkpoint, overrides)
    validate(cfg)
    device = select_device(cfg.train.device)
    dtype = select_dtype(cfg.train.dtype, device)
    configure_backends(device, cfg.train.num_threads)
    model = build_model(cfg)
    model.load_state_dict(checkpoint["model"])
    model.to(device)
    # [data hook, #8.5] data.eval_split: the val split of the training corpus, all of another one
    val_tokens = eval_tokens(cfg.data, checkpoint["config"]["data"], checkpoint.get("corpus"))
    wandb_run = init_wandb(cfg, run_dir, checkpoint.get("wandb_run_id"), job_type="eval")
    print(f"eval: {run_dir} (pe={cfg.pe.name}, trained {checkpoint['step']} steps at length {cfg.train.seq_len})",
          flush=True)
    run_extrapolation_eval(cfg, model, val_tokens, run_dir, device, dtype, wandb_run, step=checkpoint["step"])
    if wandb_run is not None:
        wandb_run.finish()


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main(sys.argv[1:])
