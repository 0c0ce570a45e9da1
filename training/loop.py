"""The training loop: config -> model -> data -> steps -> metrics, checkpoints, W&B -> extrapolation eval.

What makes a run safe to stop, kill and continue:
- a checkpoint every train.checkpoint_every steps, at the end, and when SIGTERM, SIGINT or SIGUSR2 arrives
  (scheduler preemption or time limit, Ctrl-C); train.py then exits with 128 + the signal. Under torchrun
  the ranks stop together at the next multiple of train.log_every. A kill -9 loses at most
  train.checkpoint_every steps: checkpoints are written atomically (core/checkpoint.py).
- train.resume=true continues from <run_dir>/checkpoints/last.pt as if the run had never stopped: the same
  weights, optimizer moments, schedule, RNG and batches (the sampler's generator state), and metrics.jsonl
  cut back to the checkpoint. On CPU the loss sequence is bit-identical to an uninterrupted run.
- a non-finite loss stops the run with a clear error (or, with train.skip_nonfinite=true, skips the step),
  and weights that are not finite are never saved, so last.pt stays the last good checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from core import distributed
from core.builders import build_model
from core.checkpoint import last_checkpoint_path, load_checkpoint, save_checkpoint
from core.config import validate
from core.errors import PosGPTError
from core.runtime import (autocast, configure_backends, flops_per_token, peak_flops, select_device, select_dtype,
                          seed_everything)
from core.tracking import MetricsFile, init_wandb
from data import check_corpus, corpus_identity, load_splits, sample_batch
from data import validate as validate_data
from training.batches import BatchStream, rank_rows
from training.optim import build_optimizer, build_scheduler, lr_multiplier
from training.step import TrainStep

# Settings a resumed run may change: how long it trains, how often it logs, evaluates and saves, and on
# what and how fast it runs. Everything else decides which model comes out, so it must match the checkpoint.
RESUMABLE_SETTINGS = (
    "train.max_steps", "train.resume", "train.log_every", "train.val_every", "train.val_batches",
    "train.checkpoint_every", "train.keep_checkpoints", "train.grad_accum_steps", "train.device", "train.dtype",
    "train.compile", "train.num_threads", "train.skip_nonfinite", "train.distributed", "train.eval_after",
    "model.attn_backend", "data.cache_dir", "data.num_proc", "data.eval_split", "eval.", "logging.",
)


class StopRequested:
    """While active, SIGTERM, SIGINT and SIGUSR2 ask the loop to checkpoint and stop after the current step.

    SIGTERM: preemption or the end of a SLURM time limit; SIGINT: Ctrl-C; SIGUSR2: submitit's warning,
    signal_delay_s before a SLURM time limit (configs/hydra/launcher/slurm.yaml). A second signal acts as
    usual (quit at once): the previous handlers are back after the first one, and outside the loop (data
    loading, the final evaluation), where nothing unsaved can be lost.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

    def __enter__(self) -> StopRequested:
        self.signal: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def _handle(self, signum: int, frame) -> None:
        self.signal = signum
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __bool__(self) -> bool:
        return self.signal is not None


def _should_compile(setting: str, device: torch.device) -> bool:
    return setting == "true" or (setting == "auto" and device.type == "cuda")


@torch.no_grad()
def estimate_val_loss(model: torch.nn.Module, tokens, cfg: DictConfig, device: torch.device, dtype: torch.dtype,
                      dist: distributed.DistInfo) -> float:
    """Mean loss on the same val_batches x batch_size windows every time (a fixed-seed generator)."""
    model.eval()
    generator = torch.Generator().manual_seed(0)
    rows = rank_rows(cfg.train.batch_size, dist)
    total = torch.zeros((), device=device)
    for _ in range(cfg.train.val_batches):
        x, y = sample_batch(tokens, cfg.train.batch_size, cfg.train.seq_len, generator)
        with autocast(device, dtype):
            total += model(x[rows].to(device), y[rows].to(device)).float()
    model.train()
    return float(distributed.all_reduce_mean(total / cfg.train.val_batches, dist))


def train(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> int | None:
    """Train as cfg says; returns the signal that stopped the run early (after a checkpoint), else None."""
    validate(cfg)
    validate_data(cfg.data)  # here, not at data loading: every rank fails alike, before any collective
    dist = distributed.init_distributed(cfg.train.device)
    try:
        return _train(cfg, run_dir, overrides, dist)
    finally:
        distributed.shutdown(dist)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _resume_checkpoint(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The checkpoint to continue from (train.resume=true), or None for a fresh run in an unused directory."""
    path = last_checkpoint_path(run_dir)
    if not cfg.train.resume:
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
    saved = _flatten(checkpoint["config"])
    now = _flatten(OmegaConf.to_container(cfg, resolve=True))
    changed = [key for key in sorted(saved.keys() | now.keys())
               if saved.get(key) != now.get(key) and not key.startswith(RESUMABLE_SETTINGS)]
    if changed:
        shown = ", ".join(f"{key}={saved.get(key)} (now {now.get(key)})" for key in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise PosGPTError(
            f"cannot resume {run_dir}: it was trained with {shown}{more}. Resume with the run's own settings, "
            "or start a new run in another hydra.run.dir"
        )
    return checkpoint


def _restore_training_state(checkpoint: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
             cfg: DictConfig, device: torch.device) -> int:
    """Load a checkpoint's training state into model, optimizer, schedule and RNG; returns its step."""
    distributed.load_full_state_dicts(model, optimizer, checkpoint["model"], checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    step = checkpoint["step"]
    # The learning rate of the next step follows this run's schedule: train.max_steps may have changed.
    for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base_lr * lr_multiplier(step, cfg.train)
    torch.set_rng_state(checkpoint["rng"]["torch"])
    if device.type == "cuda" and checkpoint["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state(checkpoint["rng"]["cuda"], device)
    return step


def _load_data(cfg: DictConfig, dist: distributed.DistInfo) -> dict:
    """Tokenize once per node (local rank 0 goes first, the others then read its cache); only rank 0 prints."""
    with contextlib.nullcontext() if dist.is_main else contextlib.redirect_stdout(io.StringIO()):
        if dist.local_rank == 0:
            splits = load_splits(cfg.data)
        distributed.barrier(dist)
        if dist.local_rank != 0:
            splits = load_splits(cfg.data)
    return splits


def _weights_finite(model: torch.nn.Module, dist: distributed.DistInfo, device: torch.device) -> bool:
    """Whether every parameter is finite on every rank (collective under torchrun)."""
    bad = any(not torch.isfinite(distributed.local_tensor(p)).all() for p in model.parameters())
    return not distributed.any_rank(bad, dist, device)


def _train(cfg: DictConfig, run_dir: Path, overrides: list[str], dist: distributed.DistInfo) -> int | None:
    t = cfg.train
    if t.batch_size % (dist.world_size * t.grad_accum_steps):
        raise PosGPTError(
            f"train.batch_size={t.batch_size} (the global batch) must be divisible by the number of processes "
            f"({dist.world_size}) x train.grad_accum_steps ({t.grad_accum_steps})"
        )
    run_dir = Path(distributed.broadcast_object(str(run_dir), dist))  # ${now:...} may differ across ranks
    device = distributed.device_for(dist, select_device(t.device))
    dtype = select_dtype(t.dtype, device)
    configure_backends(device, t.num_threads)
    seed_everything(t.seed)

    raw_model = build_model(cfg).to(device)  # first: a model config error shows up before anything else
    checkpoint = _resume_checkpoint(cfg, run_dir)
    if checkpoint is not None and checkpoint["step"] >= t.max_steps:
        if dist.is_main:
            print(f"train: {run_dir} has already trained {checkpoint['step']} steps (train.max_steps="
                  f"{t.max_steps}); nothing to do. Raise train.max_steps to train longer", flush=True)
        return None
    splits = _load_data(cfg, dist)
    corpus = corpus_identity(splits)  # [data hook, #12.2] saved in every checkpoint; a resume must match it
    if checkpoint is not None:
        check_corpus(checkpoint.get("corpus"), splits, cfg.data)
    model = distributed.wrap_model(raw_model, dist, t.distributed, device)
    optimizer = build_optimizer(raw_model, t, device)
    scheduler = build_scheduler(optimizer, t)
    start_step = 0
    if checkpoint is not None:
        start_step = _restore_training_state(checkpoint, raw_model, optimizer, scheduler, cfg, device)
        if dist.is_main:
            print(f"train: resuming {run_dir} from step {start_step}", flush=True)
            planned = checkpoint["config"]["train"]["max_steps"]
            if planned != t.max_steps:
                print(f"train: train.max_steps is now {t.max_steps} (was {planned}): the learning-rate schedule "
                      "follows the new value from here on", flush=True)
    if _should_compile(t.compile, device):
        model = torch.compile(model)

    batches = BatchStream(splits["train"], t.batch_size, t.seq_len, t.seed, dist, device,
                          state=checkpoint["sampler_state"] if checkpoint else None)
    step_fn = TrainStep(model, optimizer, scheduler, t.grad_accum_steps, t.grad_clip, device, dtype)

    wandb_run, metrics = None, None
    if dist.is_main:
        wandb_run = init_wandb(cfg, run_dir, checkpoint.get("wandb_run_id") if checkpoint else None)
        metrics = MetricsFile(run_dir, resume_step=start_step if checkpoint else None)
        print(f"train: pe={cfg.pe.name} params={raw_model.num_params() / 1e6:.2f}M device={device} dtype={dtype} "
              f"world={dist.world_size} run_dir={run_dir}", flush=True)
    flops_token = flops_per_token(raw_model.num_params(), cfg.model.n_layer, cfg.model.n_embd, t.seq_len)
    peak = peak_flops(device)
    tokens_per_step = t.batch_size * t.seq_len
    last_path = last_checkpoint_path(run_dir)
    last_saved = start_step if checkpoint else None

    def kept() -> str:
        if last_saved is None:
            return "no checkpoint had been saved yet"
        return f"{last_path} still holds the last good checkpoint (step {last_saved})"

    def save(step: int) -> None:
        nonlocal last_saved
        if not _weights_finite(raw_model, dist, device):
            raise PosGPTError(f"the weights became non-finite by step {step} and were not saved; {kept()}. "
                              f"Lower train.lr (now {t.lr})")
        model_state, optim_state = distributed.full_state_dicts(raw_model, optimizer)
        if dist.is_main:
            save_checkpoint({
                "model": model_state, "optimizer": optim_state, "scheduler": scheduler.state_dict(), "step": step,
                "config": OmegaConf.to_container(cfg, resolve=True), "overrides": list(overrides),
                "rng": {"torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
                "sampler_state": batches.sampler_state, "corpus": corpus,
                "wandb_run_id": wandb_run.id if wandb_run is not None else None,
            }, run_dir, keep=t.keep_checkpoints)
        last_saved = step

    progress = tqdm(total=t.max_steps, initial=start_step, desc=f"train pe={cfg.pe.name}", unit="step",
                    disable=not (dist.is_main and cfg.logging.progress), dynamic_ncols=True)
    model.train()
    window_loss, window_counted, window_steps = torch.zeros((), device=device), 0, 0
    window_start = time.perf_counter()
    step, stopped_by = start_step, None
    with StopRequested() as stop:
        while step < t.max_steps:
            x, y = batches.next()
            loss, grad_norm, skipped = step_fn(x, y, skip_nonfinite=t.skip_nonfinite)
            step += 1
            window_steps += 1
            progress.update(1)
            if skipped:
                if dist.is_main:
                    print(f"train: step {step}: non-finite loss or gradients, step skipped", flush=True)
            else:
                window_loss += loss
                window_counted += 1
            stopping = _stop_agreed(stop, dist, step, t.log_every, device)
            record, diverged = {}, False
            if step % t.log_every == 0 or step == t.max_steps or stopping:
                # 0/0 is NaN: a window whose steps were all skipped logs a null loss
                train_loss = float(distributed.all_reduce_mean(window_loss / window_counted, dist))
                diverged = not math.isfinite(train_loss) and not t.skip_nonfinite
                tokens_per_s = window_steps * tokens_per_step / (time.perf_counter() - window_start)
                record = {"step": step, "train_loss": train_loss, "lr": scheduler.get_last_lr()[0],
                          "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_s,
                          "mfu": flops_token * tokens_per_s / peak if peak else None}
                progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
                window_loss, window_counted, window_steps = torch.zeros((), device=device), 0, 0
                window_start = time.perf_counter()
            if step % t.val_every == 0 or step == t.max_steps:
                record.setdefault("step", step)
                record["val_loss"] = estimate_val_loss(model, splits["val"], cfg, device, dtype, dist)
            if record and dist.is_main:
                metrics.write(record)
                if wandb_run is not None:
                    wandb_run.log({f"train/{k}": v for k, v in record.items() if k != "step" and v is not None},
                                  step=step)
            if diverged:  # checked on every rank alike: the loss is averaged over them
                raise PosGPTError(f"the training loss became non-finite by step {step}; {kept()}. Lower train.lr "
                                  f"(now {t.lr}), or pass train.skip_nonfinite=true to skip such steps")
            if step % t.checkpoint_every == 0 or step == t.max_steps or stopping:
                save(step)
            if stopping:
                stopped_by = stop.signal
                break
    progress.close()

    if stopped_by is not None:
        if dist.is_main:
            print(f"train: stopped by {signal.Signals(stopped_by).name} at step {step}; checkpoint saved. "
                  "Continue with train.resume=true", flush=True)
    elif t.eval_after:
        _evaluate(cfg, raw_model, optimizer, splits["val"], run_dir, device, dtype, dist, wandb_run)
    if wandb_run is not None:
        wandb_run.finish()
    return stopped_by


def _evaluate(cfg: DictConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer, val_tokens,
              run_dir: Path, device: torch.device, dtype: torch.dtype, dist: distributed.DistInfo, wandb_run) -> None:
    """The extrapolation eval, on rank 0 alone: with FSDP it gets an unsharded copy of the model (the same
    memory eval.py needs)."""
    from evaluation.run import run_extrapolation_eval  # imports matplotlib (1 s): only when it is needed

    if dist.enabled and cfg.train.distributed == "fsdp":
        state, _ = distributed.full_state_dicts(model, optimizer)
        if dist.is_main:
            model = build_model(cfg).to(device)
            model.load_state_dict(state)
    if dist.is_main:
        run_extrapolation_eval(cfg, model, val_tokens, run_dir, device, dtype, wandb_run)


def _stop_agreed(stop: StopRequested, dist: distributed.DistInfo, step: int, every: int,
                 device: torch.device) -> bool:
    """Single process: stop at once. Several processes must stop at the same step, so they agree at logging
    intervals (one tiny all-reduce): a signal waits at most log_every steps."""
    if not dist.enabled:
        return bool(stop)
    if step % every:
        return False
    return distributed.any_rank(bool(stop), dist, device)
