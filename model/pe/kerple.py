"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge & Rudnicky 2022, "KERPLE: Kernelized
Relative Positional Embedding for Length Extrapolation", eqs. for the logarithmic and power variants).

A conditionally positive definite kernel of the distance n = i - j, per head and per layer:

    log   (``kernel: log``, default):  b(i, j) = -r1 log(1 + r2 n),      r1, r2 > 0
    power (``kernel: power``):          b(i, j) = -a n^p,                 a > 0, 0 < p <= 2

r1, r2 (a, p) are learned per head in every layer, initialised uniformly in (0, 2) and (0, 1) for
(r1, r2) = (p, a) in the reference code (chijames/KERPLE, ``ParallelKerpleLog``: ``bias_p`` ~ 2 U(0, 1),
``bias_a`` ~ U(0, 1)), which clamps them at eps = 1e-2 (p at most 2) before each forward pass. Here the
forward pass uses the clamped value while the gradient passes straight through to the stored parameter, so
a parameter below eps is not stuck there; the values used are always in range. Not weight-decayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.domain import choice
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import DistanceBias, LayerwiseBias, UncompiledScoreBias

EPS = 1e-2  # the reference code's lower clamp


@dataclass
class KerpleConfig(PEConfig):
    name: str = "kerple"
    kernel: str = choice("log", ("log", "power"))


def clamp_straight_through(x: torch.Tensor, low: float, high: float | None = None) -> torch.Tensor:
    """x clamped to [low, high] in the forward pass, with the identity's gradient."""
    return x + (x.clamp(min=low, max=high) - x).detach()


class KerplePositionalEncoding(DistanceBias, LayerwiseBias, UncompiledScoreBias, PositionalEncoding):
    name = "kerple"
    config_class = KerpleConfig
    # UncompiledScoreBias: score_bias inside FlexAttention's score_mod failed its backward on an H200 (torch 2.11):
    # "Using multiple indexing operations on the same tensor that requires gradients in a score_mod function is not
    # currently supported" (the layer's row, then the head's entry). With positions 0..T-1 the score_mod reads the bias
    # from its table per distance instead (one index into one tensor, model/kernels.py) and CUDA runs FlexAttention;
    # with positions given per token the bias goes through sdpa there, which matches the math path.

    def __init__(self, cfg: KerpleConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        shape = (dims.n_layer, dims.n_head)
        # log: (r1, r2); power: (p, a). Named as in the reference code.
        self.bias_p = nn.Parameter(torch.rand(shape) * 2)
        self.bias_a = nn.Parameter(torch.rand(shape))

    def no_weight_decay(self) -> list[nn.Parameter]:
        return [self.bias_p, self.bias_a]

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        n = (q_pos - k_pos).clamp(min=0).float()  # masked entries (j > i) stay finite
        a = clamp_straight_through(self.bias_a[layer], EPS)[head]
        if self.cfg.kernel == "log":
            r1 = clamp_straight_through(self.bias_p[layer], EPS)[head]
            return -r1 * torch.log1p(a * n)
        p = clamp_straight_through(self.bias_p[layer], EPS, 2.0)[head]
        return -a * n.pow(p)
