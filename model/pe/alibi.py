"""ALiBi: attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long").

No position vectors at all; each head h adds a penalty proportional to the query-key distance:

    score(i, j) = q_i . k_j / sqrt(d) - m_h * (i - j)        (j <= i)

with per-head slopes m forming a geometric sequence. For n heads, n a power of two:
m_h = 2^(-8h/n), h = 1..n (8 heads: 1/2, 1/4, ..., 1/256). Otherwise the paper takes the slopes for the
closest power of two below n, and fills the rest with every other slope of 2n's sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from model.pe.base import ModelDims, PEConfig, PositionalEncoding
from model.pe.capabilities import DistanceBias


@dataclass
class ALiBiConfig(PEConfig):
    name: str = "alibi"


def alibi_slopes(n_head: int) -> list[float]:
    """The paper's head slopes (reference: ofirpress/attention_with_linear_biases, get_slopes)."""

    def power_of_two_slopes(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if math.log2(n_head).is_integer():
        return power_of_two_slopes(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: n_head - closest]


class ALiBiPositionalEncoding(DistanceBias, PositionalEncoding):
    name = "alibi"
    config_class = ALiBiConfig

    def __init__(self, cfg: ALiBiConfig, dims: ModelDims) -> None:
        super().__init__(cfg, dims)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(dims.n_head)), persistent=False)

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor, layer: int) -> torch.Tensor:
        return -self.slopes[head] * (q_pos - k_pos)
