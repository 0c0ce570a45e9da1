"""Build the model from a composed config, load a trained run, and count FLOPs: the one place train.py,
eval.py, sample.py and scripts/ agree on them."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from core.checkpoint_io import CHECKPOINT_DIR, checkpoint_file, load_checkpoint, load_weights
from core.config_keys import overridden_keys
from core.errors import PosGPTError
from core.runtime import flops_per_token, set_up_runtime
from data.tasks import NO_TASK
from experiment.config import validate
from experiment.eval_checks import check_eval_settings
from experiment.settings import config_for_evaluation, given_wins, trained_config
from model import GPT


def build_model(cfg: DictConfig) -> GPT:
    return GPT(OmegaConf.to_object(cfg.model), OmegaConf.to_object(cfg.pe), train_seq_len=cfg.train.seq_len)


def model_flops_per_token(model: GPT, seq_len: int) -> float:
    """:func:`core.runtime.flops_per_token` of a posgpt GPT trained at ``seq_len``; N leaves out the scheme's
    lookup tables (a learned position table is read, not multiplied). Used for MFU by training and bench."""
    lookups = sum(m.weight.numel() for m in model.pe.modules() if isinstance(m, nn.Embedding))
    return flops_per_token(model.num_params() - lookups, model.cfg.n_layer, model.cfg.n_embd, seq_len)


def parse_run_dir(argv: list[str], usage: str) -> tuple[Path, list[str]]:
    """``run_dir=<dir>`` and the other arguments (Hydra overrides) of eval.py, sample.py and the scripts."""
    run_dirs = [a for a in argv if a.startswith("run_dir=")]
    if len(run_dirs) != 1 or any(a in ("-h", "--help") for a in argv):
        raise PosGPTError(usage)
    run_dir = Path(run_dirs[0].split("=", 1)[1])
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # those are said below, or by lock_run
        run_dir.stat()  # a loop of links or a name too long: core.cli's one line for it, not "does not exist"
    if run_dir.is_file():  # results are written next to the checkpoints, so the directory is needed
        hint = f"run_dir={run_dir.parent.parent}" if run_dir.parent.name == CHECKPOINT_DIR else "its run directory"
        raise PosGPTError(
            f"run_dir={run_dir} is a file; pass the training run's directory ({hint}), which holds "
            f"{CHECKPOINT_DIR}/last.pt"
        )
    return run_dir, [a for a in argv if not a.startswith("run_dir=")]


@dataclass
class TrainedRun:
    """A trained run, ready to evaluate or sample: the model its checkpoint describes, with its weights."""

    dir: Path
    checkpoint: dict
    cfg: DictConfig  # the checkpoint's config plus the overrides an evaluation may make
    model: GPT
    device: torch.device
    dtype: torch.dtype


def require_text_run(run: TrainedRun, doing: str) -> None:
    """A task run's tokens are its task's own symbols, not GPT-2's: text given to it means nothing, and its ids
    index past the model's vocabulary."""
    if run.cfg.task.name != NO_TASK:
        raise PosGPTError(
            f"{run.dir} was trained on task={run.cfg.task.name}: {doing} means nothing; evaluate it with "
            f"python eval.py run_dir={run.dir}"
        )


def load_trained_run(run_dir: Path, overrides: list[str], command: str) -> TrainedRun:
    """Build the model from the checkpoint's own config (experiment/settings.py refuses overrides that would
    change it), load its weights, and set up device and precision; the model is in eval mode. A setting the run
    does not read is refused among the overrides only: a trained setting that an override leaves unread (a
    scaling's own parameters, evaluated without the scaling) was read in training; so is one that ``command``
    (the script) does not read, as the schema declares."""
    checkpoint = load_checkpoint(run_dir)
    cfg = config_for_evaluation(checkpoint, overrides, command)
    keys = overridden_keys(overrides)

    def check(candidate: DictConfig) -> None:  # what the stored settings, with the user's, must pass
        validate(candidate, keys=keys, command=command)
        if command == "eval.py":  # the command that runs the evaluation its eval.* settings describe
            check_eval_settings(candidate)

    cfg = given_wins(cfg, keys, check, command)
    device, dtype = set_up_runtime(OmegaConf.to_object(cfg.train))
    model = build_model(cfg)
    load_weights(model, checkpoint["model"], checkpoint_file(run_dir))
    model.to(device).eval()
    return TrainedRun(run_dir, checkpoint, cfg, model, device, dtype)


def open_trained_model(run_dir: str | Path) -> tuple[GPT, str, int]:
    """The model another run's checkpoint holds (an evaluator's, eval.key_evaluator), built from the config it
    records, typed by today's schema, its weights loaded; with the task it was trained on and the checkpoint's step
    (what an evaluator reads of another run: no config crosses into evaluation/)."""
    checkpoint = load_checkpoint(run_dir)
    cfg = trained_config(checkpoint["config"])
    model = build_model(cfg)
    load_weights(model, checkpoint["model"], checkpoint_file(run_dir))
    return model, cfg.task.name, int(checkpoint["step"])
