"""Language-model head + cross-entropy.

Kept apart from the model so the (dominant, at small widths) cost of the vocabulary projection can be
optimised in one place.

At GPT-2's vocabulary the head is the largest cost of a small model. The textbook path
(``F.cross_entropy(hidden @ weight.T, targets)`` then backward) materialises the (B*T, V) logits and then
several more tensors of that size: log_softmax's output, nll_loss's zero-filled gradient and log_softmax's
gradient, each a fresh 412 MB allocation at 8 x 256 tokens x 50304, and computes exp() over it twice.

The fused path (:class:`_FusedLinearCrossEntropy`) walks the rows in chunks instead. For each chunk it
computes the logits, the loss, and at once the gradient of the logits (softmax - onehot, written in place
over the logits), which it multiplies into grad_hidden and grad_weight. The full logits never exist, one
chunk-sized buffer is reused, and backward only scales the two gradients by the incoming one. Its speed-up
is measured by ``scripts/bench.py`` (see bench/README.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Where training uses the fused path: "auto" = on CPU, where it is measured to pay (bench/README.md); on CUDA
# the plain path, fused by torch.compile, has not been measured against it yet. "always" / "never" force it
# (for benchmarks and tests).
FUSED = "auto"

# Logits computed at once by the fused path, at most, in elements; its one buffer of this size is reused for
# every chunk. Smaller chunks stay in cache but make thinner matmuls and re-read the weight and grad_weight
# once more each. Tuned on a 2-core CPU at V=50304 (bench/README.md): 4 chunks of 512 rows for 2048 rows.
FUSED_CHUNK = 1 << 25
# Logits computed at once when no gradient is needed (evaluation at long context).
NO_GRAD_CHUNK = 1 << 25

REDUCTIONS = ("mean", "sum", "none")


def lm_head_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``targets``.

    hidden: (B, T, C), weight: (V, C), targets: (B, T) with -100 meaning "not scored".
    reduction "mean" -> scalar over scored tokens; "sum" -> their sum; "none" -> (B, T) per-token losses
    (0 where unscored).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {reduction!r})")
    flat_hidden, flat_targets = hidden.flatten(0, 1), targets.flatten()
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        losses = _chunked_losses(flat_hidden, weight, flat_targets)
        if reduction == "none":
            return losses.view_as(targets)
        total = losses.sum()
        return total / (flat_targets != -100).sum() if reduction == "mean" else total
    if reduction != "none" and use_fused(hidden.device):
        return _FusedLinearCrossEntropy.apply(flat_hidden, weight, flat_targets, reduction == "mean")
    logits = (flat_hidden @ weight.t()).float()
    losses = F.cross_entropy(logits, flat_targets, ignore_index=-100, reduction=reduction)
    return losses.view_as(targets) if reduction == "none" else losses


def use_fused(device: torch.device) -> bool:
    """Whether training on ``device`` takes the fused chunked path (see ``FUSED``)."""
    if FUSED not in ("auto", "always", "never"):
        raise ValueError(f"model.loss.FUSED must be auto, always or never (got {FUSED!r})")
    return FUSED == "always" or (FUSED == "auto" and device.type == "cpu")


def _chunked_losses(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-row losses without gradients, never holding more than NO_GRAD_CHUNK logits at once."""
    rows = max(1, NO_GRAD_CHUNK // weight.shape[0])
    return torch.cat([
        F.cross_entropy((h @ weight.t()).float(), t, ignore_index=-100, reduction="none")
        for h, t in zip(hidden.split(rows), targets.split(rows))
    ])


def _compute_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The matmul dtype autocast would pick here (bf16 under bf16 autocast), else ``default``."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return default


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean (or summed) cross-entropy of ``hidden @ weight.T``; both gradients are computed in forward.

    Matmuls run in the autocast dtype when autocast is on; softmax, loss and grad_weight's accumulation are
    fp32. Nothing here reads a value back to the host, so a CUDA step stays free of syncs.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mean: bool) -> torch.Tensor:
        dtype = _compute_dtype(hidden.device, weight.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            scored = (targets != -100).float()
            n_scored = scored.sum()
            # d loss / d logit of a row: (softmax - onehot) * row_weight (0 for unscored rows).
            row_weight = scored / n_scored.clamp(min=1) if mean else scored
            safe_targets = targets.clamp(min=0).unsqueeze(1)  # -100 -> 0: gathered, then weighted by 0

            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            total = torch.zeros((), device=hidden.device, dtype=torch.float32)
            n_chunks = max(1, math.ceil(h.shape[0] * w.shape[0] / FUSED_CHUNK))
            rows = max(1, math.ceil(h.shape[0] / n_chunks))  # equal chunks: no thin, slow last matmul
            buffer = torch.empty(rows, w.shape[0], device=h.device, dtype=dtype)
            for start in range(0, h.shape[0], rows):
                stop = min(start + rows, h.shape[0])
                h_chunk, weights = h[start:stop], row_weight[start:stop, None]
                logits = torch.mm(h_chunk, w.t(), out=buffer[: stop - start]).float()
                # loss = logsumexp(logits) - logits[target]; the exponentials become the softmax in place.
                row_max = logits.amax(dim=1, keepdim=True)
                target_logit = logits.gather(1, safe_targets[start:stop])
                probs = logits.sub_(row_max).exp_()
                sum_exp = probs.sum(dim=1, keepdim=True)
                total += ((sum_exp.log() + row_max - target_logit).squeeze(1) * scored[start:stop]).sum()
                grad_logits = probs.mul_(weights / sum_exp)
                grad_logits.scatter_add_(1, safe_targets[start:stop], -weights)
                grad_low = grad_logits.to(dtype)
                grad_hidden[start:stop] = grad_low @ w
                if grad_low.dtype == grad_weight.dtype:
                    grad_weight.addmm_(grad_low.t(), h_chunk)
                else:
                    grad_weight += grad_low.t() @ h_chunk
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total / n_scored if mean else total

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss, None, None
