"""AdamW with GPT-2's weight-decay split, and linear warmup followed by cosine decay."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig

from model import GPT


def build_optimizer(model: GPT, cfg: DictConfig, device: torch.device) -> torch.optim.AdamW:
    """Decay matrices (embeddings, linear weights); never biases, LayerNorm gains or other vectors, nor the
    matrices the model declares in ``no_weight_decay()`` (a positional scheme's tables of biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    exempt = {id(p) for p in model.no_weight_decay()}
    decayed = [p for p in params if p.dim() >= 2 and id(p) not in exempt]
    groups = [
        {"params": decayed, "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if id(p) not in {id(d) for d in decayed}], "weight_decay": 0.0},
    ]
    # The fused kernel is one launch for all parameters on CUDA (and vectorised on CPU).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=device.type in ("cuda", "cpu"))


def lr_multiplier(step: int, cfg: DictConfig) -> float:
    """lr(step) / lr: linear warmup over warmup_steps, then cosine from 1 down to min_lr_ratio."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: DictConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, cfg))
