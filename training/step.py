"""One optimizer step: gradient accumulation, clipping, AdamW, schedule. No host-device sync inside.

A compiled model comes with its eager original (``eager``): if the first step fails (torch.compile's tracing,
inductor or triton raise on a machine they do not support), the step warns once and is redone eagerly
(model/fallback.py), and the run goes on uncompiled (``TrainStep.compiled`` says which ran) instead of dying at
the top of a queue.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from core.runtime import autocast
from model.fallback import Fallback
from training.distributed import local_tensor, no_grad_sync


class TrainStep:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        grad_accum_steps: int,
        grad_clip: float,
        device: torch.device,
        dtype: torch.dtype,
        eager: nn.Module | None = None,
    ) -> None:
        """``eager``: when ``model`` is compiled, the model it compiles, to fall back to at the first step."""
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_accum_steps, self.grad_clip = grad_accum_steps, grad_clip
        self.device, self.dtype = device, dtype
        self.eager = eager
        self.compiled = eager is not None  # whether the compiled model runs the steps
        self.compile_fallback = Fallback("torch.compile failed at the first training step", "training runs eagerly")

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        skip_nonfinite: bool = False,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if self.eager is None:
            return self.step(x, y, skip_nonfinite, positions, documents)
        result = self.compile_fallback.run(self.step, self._step_eagerly, x, y, skip_nonfinite, positions, documents)
        self.eager = None  # compiled or not, the first step has run
        return result

    def _step_eagerly(self, *args) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The first step again on the eager model, which runs every step from then on."""
        self.optimizer.zero_grad(set_to_none=True)  # what the failed step accumulated
        self.model, self.compiled = self.eager, False
        return self.step(*args)

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        skip_nonfinite: bool = False,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Train on this rank's rows (split into micro-batches), at ``positions`` (B, T) if given, with each row's
        ``documents`` (B, T) kept apart if given (data.document_aware).

        Returns (mean loss, grad norm) as device tensors, and whether the step was skipped: with
        ``skip_nonfinite`` a NaN/inf gradient discards the step (no update; the schedule still advances so
        that step and learning rate stay in line). That check needs one host sync per step, so it is off by
        default.
        """
        total = torch.zeros((), device=self.device)
        micro_x, micro_y = x.chunk(self.grad_accum_steps), y.chunk(self.grad_accum_steps)
        micro_p = positions.chunk(self.grad_accum_steps) if positions is not None else [None] * len(micro_x)
        micro_d = documents.chunk(self.grad_accum_steps) if documents is not None else [None] * len(micro_x)
        for i, (mx, my, mp, md) in enumerate(zip(micro_x, micro_y, micro_p, micro_d)):
            with no_grad_sync(self.model, sync=i == self.grad_accum_steps - 1):
                with autocast(self.device, self.dtype):
                    loss = self.model(mx, my, positions=mp, documents=md) / self.grad_accum_steps
                loss.backward()
            total += loss.detach()
        # The norm is computed from the all-reduced gradients, so under DDP/FSDP every rank takes the same
        # decision (FSDP returns it as a replicated DTensor).
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = local_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        skipped = skip_nonfinite and not torch.isfinite(grad_norm).item()
        if not skipped:
            self.optimizer.step()
        with warnings.catch_warnings():  # a skipped first step: torch warns of the order, which is meant here
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total, grad_norm, skipped
