"""The training loop: config -> data -> model -> steps -> metrics, checkpoints, W&B -> extrapolation eval."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from core import distributed
from core.builders import build_model
from core.checkpoint import last_checkpoint_path, load_checkpoint, save_checkpoint
from core.config import validate
from core.errors import PosGPTError
from core.runtime import (configure_backends, flops_per_token, peak_flops, select_device, select_dtype,
                          seed_everything)
from core.tracking import MetricsFile, init_wandb
from data import load_splits, sample_batch
from evaluation.run import run_extrapolation_eval
from training.batches import BatchStream
from training.optim import build_optimizer, build_scheduler
from training.step import TrainStep


class StopRequested:
    """SIGTERM/SIGINT (scheduler preemption, Ctrl-C) ask the loop to checkpoint and exit at the next step."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


def _should_compile(setting: str, device: torch.device) -> bool:
    return setting == "true" or (setting == "auto" and device.type == "cuda")


@torch.no_grad()
def estimate_val_loss(model, tokens, cfg: DictConfig, device, dtype, dist) -> float:
    """Mean loss on the same val_batches x batch_size windows every time (a fixed-seed generator)."""
    from core.runtime import autocast

    model.eval()
    generator = torch.Generator().manual_seed(0)
    rows = cfg.train.batch_size // dist.world_size
    total = torch.zeros((), device=device)
    for _ in range(cfg.train.val_batches):
        x, y = sample_batch(tokens, cfg.train.batch_size, cfg.train.seq_len, generator)
        x, y = x[dist.rank * rows:(dist.rank + 1) * rows].to(device), y[dist.rank * rows:(dist.rank + 1) * rows].to(device)
        with autocast(device, dtype):
            total += model(x, y).float()
    model.train()
    return float(distributed.all_reduce_mean(total / cfg.train.val_batches, dist))


def train(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> None:
    validate(cfg)
    t = cfg.train
    dist = distributed.init_distributed(t.device)
    try:
        _train(cfg, run_dir, overrides, dist)
    finally:
        distributed.shutdown(dist)


def _train(cfg: DictConfig, run_dir: Path, overrides: list[str], dist: distributed.DistInfo) -> None:
    t = cfg.train
    if t.batch_size % (dist.world_size * t.grad_accum_steps):
        raise PosGPTError(
            f"train.batch_size={t.batch_size} must be divisible by world size ({dist.world_size}) x "
            f"train.grad_accum_steps ({t.grad_accum_steps})"
        )
    device = distributed.device_for(dist, select_device(t.device))
    dtype = select_dtype(t.dtype, device)
    configure_backends(device, t.num_threads)
    seed_everything(t.seed)

    # Tokenize once (rank 0), then everyone reads the cache.
    if dist.is_main:
        splits = load_splits(cfg.data)
    distributed.barrier(dist)
    if not dist.is_main:
        splits = load_splits(cfg.data)

    checkpoint = None
    last_path = last_checkpoint_path(run_dir)
    if t.resume:
        checkpoint = load_checkpoint(last_path)
    elif last_path.exists():
        raise PosGPTError(
            f"{run_dir} already holds a checkpoint; pass train.resume=true to continue it, "
            "or choose another hydra.run.dir (nothing was overwritten)"
        )

    raw_model = build_model(cfg).to(device)
    optimizer = build_optimizer(raw_model, t, device)
    scheduler = build_scheduler(optimizer, t)
    start_step = 0
    if checkpoint is not None:
        distributed.load_full_state_dicts(raw_model, optimizer, checkpoint["model"], checkpoint["optimizer"], dist)
        scheduler.load_state_dict(checkpoint["scheduler"])
        start_step = checkpoint["step"]
        torch.set_rng_state(checkpoint["rng"]["torch"])
        if device.type == "cuda" and checkpoint["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(checkpoint["rng"]["cuda"], device)
        if dist.is_main:
            print(f"train: resuming {run_dir} from step {start_step}", flush=True)
    model = distributed.wrap_model(raw_model, dist, t.distributed, device)
    if _should_compile(t.compile, device):
        model = torch.compile(model)

    batches = BatchStream(splits["train"], t.batch_size, t.seq_len, t.seed, dist, device,
                          state=checkpoint["sampler_state"] if checkpoint else None)
    step_fn = TrainStep(model, optimizer, scheduler, t.grad_accum_steps, t.grad_clip, device, dtype)

    wandb_run, metrics = None, None
    if dist.is_main:
        wandb_run = init_wandb(cfg, run_dir, checkpoint.get("wandb_run_id") if checkpoint else None)
        metrics = MetricsFile(run_dir, resume_step=start_step if checkpoint else None)
        n_params = raw_model.num_params()
        print(f"train: pe={cfg.pe.name} params={n_params / 1e6:.2f}M device={device} dtype={dtype} "
              f"world={dist.world_size} run_dir={run_dir}", flush=True)
    flops_token = flops_per_token(raw_model.num_params(), cfg.model.n_layer, cfg.model.n_embd, t.seq_len)
    peak = peak_flops(device)
    tokens_per_step = t.batch_size * t.seq_len

    def save(step: int) -> None:
        model_state, optim_state = distributed.full_state_dicts(raw_model, optimizer, dist)
        if not dist.is_main:
            return
        save_checkpoint({
            "model": model_state, "optimizer": optim_state, "scheduler": scheduler.state_dict(), "step": step,
            "config": OmegaConf.to_container(cfg, resolve=True), "overrides": list(overrides),
            "rng": {"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
            "sampler_state": batches.sampler_state,
            "wandb_run_id": wandb_run.id if wandb_run is not None else None,
        }, run_dir, keep=t.keep_checkpoints)

    stop = StopRequested()
    progress = tqdm(total=t.max_steps, initial=start_step, desc=f"train pe={cfg.pe.name}", unit="step",
                    disable=not (dist.is_main and cfg.logging.progress), dynamic_ncols=True)
    model.train()
    window_loss, window_steps, window_start = torch.zeros((), device=device), 0, time.perf_counter()
    step = start_step
    while step < t.max_steps:
        x, y = batches.next()
        loss, grad_norm = step_fn(x, y, skip_nonfinite=t.skip_nonfinite)
        step += 1
        window_loss += loss
        window_steps += 1
        progress.update(1)
        record = {}
        if step % t.log_every == 0 or step == t.max_steps:
            train_loss = float(distributed.all_reduce_mean(window_loss / window_steps, dist))
            elapsed = time.perf_counter() - window_start
            tokens_per_s = window_steps * tokens_per_step / elapsed
            if not torch.isfinite(torch.tensor(train_loss)) and not t.skip_nonfinite:
                raise PosGPTError(
                    f"training loss became non-finite by step {step}; the last good checkpoint is kept in "
                    f"{last_path.parent}. Lower train.lr, or pass train.skip_nonfinite=true to skip such steps"
                )
            record = {"step": step, "train_loss": train_loss, "lr": scheduler.get_last_lr()[0],
                      "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_s,
                      "mfu": flops_token * tokens_per_s / peak if peak else None}
            progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
            window_loss, window_steps, window_start = torch.zeros((), device=device), 0, time.perf_counter()
        if step % t.val_every == 0 or step == t.max_steps:
            record.setdefault("step", step)
            record["val_loss"] = estimate_val_loss(model, splits["val"], cfg, device, dtype, dist)
        if record and dist.is_main:
            metrics.write(record)
            if wandb_run is not None:
                wandb_run.log({f"train/{k}": v for k, v in record.items() if k != "step" and v is not None}, step=step)
        if step % t.checkpoint_every == 0 or step == t.max_steps:
            save(step)
        if _stop_agreed(stop, dist, step, t.log_every):
            save(step)
            progress.close()
            if dist.is_main:
                print(f"train: stopped by signal {stop.signal} at step {step}; checkpoint saved. "
                      "Continue with train.resume=true", flush=True)
            if wandb_run is not None:
                wandb_run.finish()
            return
    progress.close()

    if t.eval_after and dist.is_main:
        run_extrapolation_eval(cfg, raw_model, splits["val"], run_dir, device, dtype, wandb_run)
    if wandb_run is not None:
        wandb_run.finish()


def _stop_agreed(stop: StopRequested, dist: distributed.DistInfo, step: int, every: int) -> bool:
    """Single process: stop at once. Under torchrun all ranks must stop at the same step, so they agree at
    logging intervals (one tiny all-reduce) — a signal waits at most log_every steps."""
    if not dist.enabled:
        return bool(stop)
    if step % every:
        return False
    flag = torch.tensor([1.0 if stop else 0.0])
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())
