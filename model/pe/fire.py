"""FIRE: functional interpolation for relative positions (Li et al. 2023, "Functional Interpolation for
Relative Positions Improves Long Context Transformers", eq. 3 and sec. 3.3).

A small MLP of the normalised query-key distance gives every head's bias, in every layer:

    b(i, j) = f_theta( psi(i - j) / psi(max(i, L)) ),    psi(x) = ln(c x + 1)

f_theta: 1 -> 32 -> n_head with a ReLU. The log transform psi (c > 0 learnable, init 0.1) stretches small
distances; dividing by psi of the query position ("progressive interpolation") maps every distance into
[0, 1], so lengths beyond training reuse inputs the MLP has seen. The threshold L (init 512, learned as
L = |multiplier x 512| with the multiplier initialised to 1) keeps short contexts from being over-stretched.
Each layer has its own MLP, c and L. Numbers follow the paper's reference code (appendix; also
mcleish7/arithmetic's ``FIRE``): ``psi`` uses |c x| and the denominator gets + 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.domain import domain
from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import LayerwiseBias, UncompiledScoreBias


@dataclass
class FireConfig(PEConfig):
    name: str = "fire"
    mlp_width: int = domain(32, ge=1)  # f_theta: 1 -> mlp_width -> heads
    init_c: float = domain(0.1, gt=0)  # psi(x) = ln(c x + 1), c learned from this start
    init_L: float = domain(512.0, gt=0)  # threshold L = |multiplier x init_L|, the multiplier learned (from 1)


class FireLayer(nn.Module):
    """One layer's f_theta, c and L multiplier."""

    def __init__(self, n_head: int, width: int, init_c: float) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(1, width), nn.Linear(width, n_head)
        self.c = nn.Parameter(torch.tensor(init_c))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))


class FirePositionalEncoding(LayerwiseBias, UncompiledScoreBias, PositionalEncoding):
    name = "fire"
    config_class = FireConfig
    # UncompiledScoreBias: inductor could not compile the MLP into FlexAttention's kernel on an H200 (torch 2.11):
    # "Buffers cannot be created while lowering a pointwise subgraph". CUDA runs the bias through sdpa instead. Not a
    # DistanceBias: the bias depends on the distance alone only while every query position is below the threshold L,
    # which is learned, so telling would read a parameter at every forward pass (a device sync, a graph break); and at
    # GPT-2's 1,024 tokens half the queries start past L = 512.

    def __init__(self, cfg: FireConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.layers = nn.ModuleList(FireLayer(dims.n_head, cfg.mlp_width, cfg.init_c) for _ in range(dims.n_layer))

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """psi(i - j) / psi(max(i, L)), broadcast over q_pos and k_pos."""
        fire = self.layers[layer]
        dtype = fire.c.dtype  # the model's: float32, or float64 for a float64 model
        distance = (q_pos - k_pos).clamp(min=0).to(dtype)  # masked entries (j > i) as distance 0
        threshold = (fire.L_multiplier * self.cfg.init_L).abs()
        normalizer = torch.maximum(q_pos.to(dtype), threshold)
        return torch.log1p((fire.c * distance).abs()) / (torch.log1p((fire.c * normalizer).abs()) + 1e-6)

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        # Written elementwise (only head's output row of the MLP) so that it also runs as a score_mod.
        fire = self.layers[layer]
        x = self.normalized_distance(q_pos, k_pos, layer)[..., None]
        hidden = torch.relu(x * fire.fc1.weight[:, 0] + fire.fc1.bias)
        return (hidden * fire.fc2.weight[head]).sum(-1) + fire.fc2.bias[head]

    def bias_block(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        # The MLP once per (i, j) for all heads, instead of once per head.
        fire = self.layers[layer]
        x = self.normalized_distance(q_pos[..., :, None], k_pos[..., None, :], layer)[..., None]
        return fire.fc2(torch.relu(fire.fc1(x))).movedim(-1, -3)
