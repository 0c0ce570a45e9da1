"""AdamW with GPT-2's weight-decay split, and linear warmup followed by cosine decay."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.domain import domain
from core.errors import PosGPTError
from model import GPT
from training.settings import BENCHMARKED, RunLength


@dataclass(frozen=True, kw_only=True)
class OptimizerSettings(RunLength):
    """What the optimizer and its schedule read: the ``train.*`` settings declared here (training/settings.py), and
    ``train.max_steps``, where the cosine ends."""

    lr: float = domain(1e-3, gt=0, commands=BENCHMARKED)
    min_lr_ratio: float = domain(0.1, ge=0, le=1, commands=BENCHMARKED)  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = domain(100, ge=0, commands=BENCHMARKED)
    weight_decay: float = domain(0.1, ge=0, commands=BENCHMARKED)
    beta1: float = domain(0.9, ge=0, lt=1, commands=BENCHMARKED)
    beta2: float = domain(0.95, ge=0, lt=1, commands=BENCHMARKED)

    def check(self) -> None:
        """AdamW scales each decayed weight by 1 - lr_t * weight_decay at every step: from 1 on, that zeroes or
        flips it."""
        if self.lr * self.weight_decay >= 1:
            raise PosGPTError(
                f"train.lr={self.lr} x train.weight_decay={self.weight_decay} is {self.lr * self.weight_decay:g}, at "
                "least 1: AdamW's decoupled decay would zero or flip the sign of every decayed weight each step; "
                "lower one"
            )


def build_optimizer(model: GPT, settings: OptimizerSettings, device: torch.device) -> torch.optim.AdamW:
    """Decay matrices (embeddings, linear weights); never biases, LayerNorm gains or other vectors, nor the
    matrices the model declares in ``no_weight_decay()`` (a positional scheme's tables of biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    exempt = {id(p) for p in model.no_weight_decay()}
    decayed = [p for p in params if p.dim() >= 2 and id(p) not in exempt]
    groups = [
        {"params": decayed, "weight_decay": settings.weight_decay},
        {"params": [p for p in params if id(p) not in {id(d) for d in decayed}], "weight_decay": 0.0},
    ]
    # The fused kernel is one launch for all parameters on CUDA (and vectorised on CPU).
    betas = (settings.beta1, settings.beta2)
    return torch.optim.AdamW(groups, lr=settings.lr, betas=betas, fused=device.type in ("cuda", "cpu"))


def lr_multiplier(step: int, settings: OptimizerSettings) -> float:
    """lr(step) / lr: linear warmup over warmup_steps, then cosine from 1 down to min_lr_ratio."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = min(1.0, (step - settings.warmup_steps) / max(1, settings.max_steps - settings.warmup_steps))
    return settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, settings: OptimizerSettings) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, settings))
