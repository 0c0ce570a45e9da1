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
is measured by ``scripts/speed.py`` (see bench/README.md).

The real vocabulary. The weight has ``padded_vocab_size`` rows (GPT-2's 50,257 tokens padded to 50,304 so the
matmul has friendly shapes), but the distribution is over the first ``vocab_size`` only: on every path the
padding columns of the logits are set to -inf before the softmax (:func:`_hide_padding`), so they get
probability exp(-inf) = 0 and no gradient, and every loss and perplexity is that of a ``vocab_size``-way
distribution. The matmul keeps its padded shape.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Where training takes the fused path (``model.fused_ce``, passed down as ``fused``): "auto" = on CPU, where it
# is measured to pay (bench/README.md); on CUDA the plain path, fused by torch.compile, has not been measured
# against it yet. "always" / "never" force it (for benchmarks and tests).
FUSED_MODES = ("auto", "always", "never")

# Logits computed at once by the fused path, at most, in elements (the default of ``chunk``); its one buffer of
# this size is reused for every chunk. Smaller chunks stay in cache but make thinner matmuls and re-read the
# weight and grad_weight once more each. Tuned on a 2-core CPU at V=50304 (bench/README.md): 4 chunks of 512
# rows for 2048 rows.
FUSED_CHUNK = 1 << 25
# Logits computed at once when no gradient is needed (evaluation at long context; the default of ``chunk``).
NO_GRAD_CHUNK = 1 << 25

REDUCTIONS = ("mean", "sum", "none")


def lm_head_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    reduction: str = "mean",
    *,
    vocab_size: int | None = None,
    fused: str = "auto",
    chunk: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` over its first ``vocab_size`` columns against ``targets``.

    hidden: (B, T, C), weight: (V_padded, C), targets: (B, T) in [0, vocab_size) or -100 for "not scored".
    vocab_size: the real vocabulary (default: every row of weight); the other rows are padding, never scored.
    reduction "mean" -> scalar over scored tokens; "sum" -> their sum; "none" -> (B, T) per-token losses
    (0 where unscored). fused: one of FUSED_MODES (``model.fused_ce``). chunk: logits per chunk, in elements
    (default FUSED_CHUNK with gradients, NO_GRAD_CHUNK without).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {reduction!r})")
    vocab_size = weight.shape[0] if vocab_size is None else vocab_size
    if not 0 < vocab_size <= weight.shape[0]:
        raise ValueError(f"vocab_size must be in [1, {weight.shape[0]}] (got {vocab_size})")
    flat_hidden, flat_targets = hidden.flatten(0, 1), targets.flatten()
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        losses = _chunked_losses(flat_hidden, weight, flat_targets, vocab_size, chunk or NO_GRAD_CHUNK)
        if reduction == "none":
            return losses.view_as(targets)
        total = losses.sum()
        return total / (flat_targets != -100).sum() if reduction == "mean" else total
    if reduction != "none" and use_fused(fused, hidden.device):
        return _FusedLinearCrossEntropy.apply(
            flat_hidden, weight, flat_targets, vocab_size, reduction == "mean", chunk or FUSED_CHUNK
        )
    logits = _hide_padding(_upcast(flat_hidden @ weight.t()), vocab_size)
    losses = F.cross_entropy(logits, flat_targets, ignore_index=-100, reduction=reduction)
    return losses.view_as(targets) if reduction == "none" else losses


def use_fused(fused: str, device: torch.device) -> bool:
    """Whether training on ``device`` takes the fused chunked path (see ``FUSED_MODES``)."""
    if fused not in FUSED_MODES:
        raise ValueError(f"fused must be one of {FUSED_MODES} (got {fused!r})")
    return fused == "always" or (fused == "auto" and device.type == "cpu")


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Softmax precision: fp32 for bf16/fp16/fp32 logits, fp64 for fp64 ones (exact checks in the tests)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _hide_padding(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Set the padding columns (vocab_size on) to -inf, in place: no probability, and no gradient, for them."""
    if vocab_size < logits.shape[-1]:
        logits[..., vocab_size:] = float("-inf")
    return logits


def _chunked_losses(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int, chunk: int
) -> torch.Tensor:
    """Per-row losses without gradients, never holding more than ``chunk`` logits at once."""
    rows = max(1, chunk // weight.shape[0])
    return torch.cat(
        [
            F.cross_entropy(_hide_padding(_upcast(h @ weight.t()), vocab_size), t, ignore_index=-100, reduction="none")
            for h, t in zip(hidden.split(rows), targets.split(rows))
        ]
    )


def _compute_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The matmul dtype autocast would pick here (bf16 under bf16 autocast), else ``default``."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return default


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean (or summed) cross-entropy of ``hidden @ weight.T`` over its first ``vocab_size`` columns; both
    gradients are computed in forward (the padding rows of weight get a zero gradient).

    Matmuls run in the autocast dtype when autocast is on; softmax, loss and grad_weight's accumulation are
    fp32 (fp64 for fp64 inputs). Nothing here reads a value back to the host, so a CUDA step stays free of syncs.
    """

    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int, mean: bool, chunk: int
    ) -> torch.Tensor:
        dtype = _compute_dtype(hidden.device, weight.dtype)
        accumulate = torch.promote_types(dtype, torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            scored = (targets != -100).to(accumulate)
            n_scored = scored.sum()
            # d loss / d logit of a row: (softmax - onehot) * row_weight (0 for unscored rows).
            row_weight = scored / n_scored.clamp(min=1) if mean else scored
            safe_targets = targets.clamp(min=0).unsqueeze(1)  # -100 -> 0: gathered, then weighted by 0

            grad_hidden = torch.empty_like(hidden)
            grad_weight = torch.zeros_like(weight, dtype=accumulate)
            total = torch.zeros((), device=hidden.device, dtype=accumulate)
            n_chunks = max(1, math.ceil(h.shape[0] * w.shape[0] / chunk))
            rows = max(1, math.ceil(h.shape[0] / n_chunks))  # equal chunks: no thin, slow last matmul
            buffer = torch.empty(rows, w.shape[0], device=h.device, dtype=dtype)
            for start in range(0, h.shape[0], rows):
                stop = min(start + rows, h.shape[0])
                h_chunk, weights = h[start:stop], row_weight[start:stop, None]
                logits = _hide_padding(_upcast(torch.mm(h_chunk, w.t(), out=buffer[: stop - start])), vocab_size)
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
        return grad_hidden * grad_loss.to(grad_hidden.dtype), grad_weight * grad_loss, None, None, None, None
