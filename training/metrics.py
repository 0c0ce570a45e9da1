"""Metrics and logging: the W&B run, metrics.jsonl, the progress bar and the window of steps since the last log
line (rank 0 writes), with the MFU of one FLOP count (experiment.build.model_flops_per_token, which the planner
counts on the model built on the meta device)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from core.runtime import peak_flops
from core.tracking import MetricsFile, TrackerSettings, init_wandb
from model import GPT
from training import distributed
from training.settings import RunLength


@dataclass(frozen=True, kw_only=True)
class MetricsSettings(RunLength):
    """What the metrics of a run read: its length (``train.max_steps``), and, passed in by the planner, its tokens
    and FLOPs a step and how it is shown."""

    pe_name: str  # pe.name, in the console's lines
    tokens_per_step: int  # train.batch_size x train.seq_len
    flops_per_token: float  # experiment.build.model_flops_per_token
    # Positions given per token (train.random_positions, data.document_aware): they keep a bias of the distance
    # off its table, which the attention backend that runs depends on.
    explicit_positions: bool
    progress: bool  # logging.progress


class MetricsWindow:
    """Opened once the run's state is ready: starts (or, resuming, continues) the W&B run and metrics.jsonl
    and prints the run's first console line."""

    def __init__(
        self,
        settings: MetricsSettings,
        tracker: TrackerSettings,
        run_dir: Path,
        start_step: int,
        checkpoint: dict | None,
        model: GPT,
        dist: distributed.DistInfo,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        explicit = settings.explicit_positions
        self.dist, self.device = dist, device
        self.tokens_per_step, self.peak = settings.tokens_per_step, peak_flops(device)
        self.flops_per_token = settings.flops_per_token
        self.wandb_run, self.metrics = None, None
        # What computes this run (a resumed run may change either): recorded by record_runtime.
        self._backends = lambda: model.attention_backend(device, explicit, dtype)
        self.runtime = {"attn_backend": self._backends(), "dtype": str(dtype).removeprefix("torch.")}
        if dist.is_main:
            self.wandb_run = init_wandb(tracker, run_dir, checkpoint.get("wandb_run_id") if checkpoint else None)
            self.metrics = MetricsFile(run_dir, resume_step=start_step if checkpoint else None)
            print(
                f"train: pe={settings.pe_name}{layer_schemes(model)} params={model.num_params() / 1e6:.2f}M "
                f"device={device} "
                f"dtype={self.runtime['dtype']} attn_backend={self.runtime['attn_backend']} "
                f"world={dist.world_size} run_dir={run_dir}",
                flush=True,
            )
            for line in model.describe_attention(device, dtype):  # each layer's attention path (model/attention.py)
                print(f"train: {line}", flush=True)
        self.progress = tqdm(
            total=settings.max_steps,
            initial=start_step,
            desc=f"train pe={settings.pe_name}",
            unit="step",
            disable=not (dist.is_main and settings.progress),
            dynamic_ncols=True,
        )
        self._reset()

    @property
    def wandb_run_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def _reset(self) -> None:
        self.loss, self.counted, self.steps = torch.zeros((), device=self.device), 0, 0
        self.started = time.perf_counter()

    def add(self, step: int, loss: torch.Tensor, skipped: bool) -> None:
        """One optimizer step (no host sync: the loss stays on the device until the window is logged)."""
        self.steps += 1
        self.progress.update(1)
        if skipped:
            if self.dist.is_main:
                print(f"train: step {step}: non-finite loss or gradients, step skipped", flush=True)
        else:
            self.loss += loss
            self.counted += 1

    def close_window(self, step: int, lr: float, grad_norm: torch.Tensor) -> dict:
        """The window's record (mean loss over ranks; collective), and a new window."""
        # 0/0 is NaN: a window whose steps were all skipped logs a null loss
        train_loss = float(distributed.all_reduce_mean(self.loss / self.counted, self.dist))
        tokens_per_s = self.steps * self.tokens_per_step / (time.perf_counter() - self.started)
        record = {
            "step": step,
            "train_loss": train_loss,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "tokens_per_s": tokens_per_s,
            "mfu": self.flops_per_token * tokens_per_s / self.peak if self.peak else None,
        }
        self.progress.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}")
        self._reset()
        return record

    def record_runtime(self, step: int) -> None:
        """metrics.jsonl's record of the attention backend that runs and the dtype, from ``step`` on (each start
        of the run writes one), and the same in the W&B run's config."""
        if self.dist.is_main:
            self.metrics.write({"step": step, **self.runtime})
            if self.wandb_run is not None:
                self.wandb_run.config.update({"runtime": self.runtime}, allow_val_change=True)

    def recheck_runtime(self, step: int) -> None:
        """After the first step: a kernel given up there (FlexAttention, a scheme's own, model/attention.py) changed
        the backend that runs, which is then recorded from ``step`` on."""
        backend = self._backends()
        if backend != self.runtime["attn_backend"]:
            self.runtime["attn_backend"] = backend
            self.record_runtime(step)

    def write(self, record: dict) -> None:
        if record and self.dist.is_main:
            self.metrics.write(record)
            if self.wandb_run is not None:
                self.wandb_run.log(
                    {f"train/{k}": v for k, v in record.items() if k != "step" and v is not None}, step=record["step"]
                )

    def close(self) -> None:
        self.progress.close()

    def finish(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()


def layer_schemes(model: GPT) -> str:
    """The scheme of each layer, ``[rope,rope,rope,none]``, where the layers do not all run the model's scheme (a
    per-layer pattern, model/pe/hybrid.py); "" otherwise."""
    names = [scheme.name for scheme, _ in model.pe.layer_schemes()]
    return "" if set(names) == {model.pe.name} else f"[{','.join(names)}]"


def finite(record: dict) -> bool:
    return math.isfinite(record.get("train_loss", 0.0))
