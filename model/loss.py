"""Language-model head + cross-entropy.

Kept apart from the model so the (dominant, at small widths) cost of the vocabulary projection can be
optimised in one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MAX_LOGITS = 1 << 25  # logits materialised at once when scoring without gradients (128 MB in fp32)


def lm_head_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` against ``targets``.

    hidden: (B, T, C), weight: (V, C), targets: (B, T) with -100 meaning "not scored".
    reduction "mean" -> scalar over scored tokens; "none" -> (B, T) per-token losses (0 where unscored).
    """
    if reduction == "none" and not torch.is_grad_enabled():
        # Evaluation at long context: never hold all (B*T, V) logits at once.
        flat_hidden, flat_targets = hidden.flatten(0, 1), targets.flatten()
        rows = max(1, _MAX_LOGITS // weight.shape[0])
        losses = torch.cat([
            F.cross_entropy((h @ weight.t()).float(), t, ignore_index=-100, reduction="none")
            for h, t in zip(flat_hidden.split(rows), flat_targets.split(rows))
        ])
        return losses.view_as(targets)
    logits = hidden @ weight.t()
    losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction=reduction)
    return losses.view_as(targets) if reduction == "none" else losses
